from __future__ import annotations

from core.machine import cpu_description, isa_class

ZEN4 = frozenset({"avx2", "avx512f", "avx512_bf16"})


def test_isa_class_names_the_kernels_pytorch_uses() -> None:
    assert isa_class(ZEN4, {}) == "avx512_bf16"
    assert isa_class(ZEN4 | {"amx_bf16"}, {}) == "amx_bf16"
    assert isa_class(frozenset({"avx2", "avx512f"}), {}) == "avx512"
    assert isa_class(frozenset({"avx2", "fma"}), {}) == "avx2"
    assert isa_class(ZEN4, {"ATEN_CPU_CAPABILITY": "avx2"}) == "avx2 kernels"


def test_description_has_a_model_a_class_and_cores() -> None:
    text = cpu_description()
    assert "(" in text and text.endswith("cores")
