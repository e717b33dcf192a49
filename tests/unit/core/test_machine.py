from __future__ import annotations

import pytest

from core import machine
from core.machine import cpu_description, cpu_flags, cpu_vendor, isa_class

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


def test_this_machines_flags_are_read() -> None:
    flags = cpu_flags()
    assert not flags or "sse2" in flags or "fp" in flags  # x86 always has SSE2; arm64 lists fp


def test_the_vendor_is_read_from_cpuinfo(monkeypatch: pytest.MonkeyPatch) -> None:
    lines = ["processor\t: 0", "vendor_id\t: AuthenticAMD", "model name\t: AMD EPYC 9R14"]
    monkeypatch.setattr(machine, "_cpuinfo", lambda: lines)
    assert cpu_vendor() == "AuthenticAMD"
    monkeypatch.setattr(machine, "_cpuinfo", lambda: ["processor\t: 0"])  # an arm64 board may name none
    assert cpu_vendor() == ""
