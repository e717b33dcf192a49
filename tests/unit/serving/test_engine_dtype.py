"""``serving.engine.dtype: auto`` on CPUs with and without bf16 arithmetic."""

from __future__ import annotations

import pytest

from serving.engine import choose_dtype, cpu_flags

AVX2_EPYC = frozenset({"avx", "avx2", "fma", "sse4_2"})
SAPPHIRE_RAPIDS = AVX2_EPYC | {"avx512f", "avx512bw", "avx512_bf16", "amx_bf16", "amx_tile"}
COOPER_LAKE = AVX2_EPYC | {"avx512f", "avx512_bf16"}


@pytest.mark.parametrize(
    ("flags", "expected"), [(AVX2_EPYC, "float32"), (SAPPHIRE_RAPIDS, "bfloat16"), (COOPER_LAKE, "bfloat16")]
)
def test_auto_on_a_cpu_uses_bf16_only_where_the_cpu_computes_in_it(flags: frozenset[str], expected: str) -> None:
    assert choose_dtype("auto", cpu=True, cpu_flags=flags) == expected


def test_an_explicit_dtype_and_gpus_are_left_alone() -> None:
    assert choose_dtype("bfloat16", cpu=True, cpu_flags=AVX2_EPYC) == "bfloat16"
    assert choose_dtype("float32", cpu=True, cpu_flags=SAPPHIRE_RAPIDS) == "float32"
    assert choose_dtype("auto", cpu=False, cpu_flags=AVX2_EPYC) == "auto"  # vLLM's own choice on a GPU


def test_this_machines_flags_are_read() -> None:
    flags = cpu_flags()
    assert not flags or "sse2" in flags or "fp" in flags  # x86 always has SSE2; arm64 lists fp
