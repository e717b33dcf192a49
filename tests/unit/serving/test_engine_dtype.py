"""``serving.engine.dtype: auto`` on CPUs with and without bf16 arithmetic, and on one held to AVX2 kernels."""

from __future__ import annotations

import pytest

from core.machine import isa_class
from serving.engines.engine import choose_dtype

AVX2_EPYC = frozenset({"avx", "avx2", "fma", "sse4_2"})
SKYLAKE_X = AVX2_EPYC | {"avx512f", "avx512bw"}
SAPPHIRE_RAPIDS = SKYLAKE_X | {"avx512_bf16", "amx_bf16", "amx_tile"}
COOPER_LAKE = SKYLAKE_X | {"avx512_bf16"}
AVX2_KERNELS = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"}


@pytest.mark.parametrize(
    ("flags", "env", "expected"),
    [
        (AVX2_EPYC, {}, "float32"),
        (SKYLAKE_X, {}, "float32"),
        (SAPPHIRE_RAPIDS, {}, "bfloat16"),
        (COOPER_LAKE, {}, "bfloat16"),
        (SAPPHIRE_RAPIDS, AVX2_KERNELS, "float32"),  # a bf16 CPU playing an AVX2 one serves like one
    ],
)
def test_auto_on_a_cpu_uses_bf16_only_where_the_kernels_compute_in_it(
    flags: frozenset[str], env: dict[str, str], expected: str
) -> None:
    assert choose_dtype("auto", cpu=True, isa=isa_class(flags, env)) == expected


def test_an_explicit_dtype_and_gpus_are_left_alone() -> None:
    assert choose_dtype("bfloat16", cpu=True, isa="avx2") == "bfloat16"
    assert choose_dtype("float32", cpu=True, isa="amx_bf16") == "float32"
    assert choose_dtype("auto", cpu=False, isa="avx2") == "auto"  # vLLM's own choice on a GPU
