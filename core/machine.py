"""What machine a number was measured on: the CPU's model name and its ISA class, named next to every published
figure (losses and eval metrics differ between CPU classes, timings more so).

    >>> cpu_description()
    'AMD EPYC (avx512_bf16)'

The class is what PyTorch and oneDNN actually use: ``ATEN_CPU_CAPABILITY=avx2`` (with ``ONEDNN_MAX_CPU_ISA=AVX2``)
holds an AVX-512 machine to AVX2 kernels, reproducing an AVX2-only machine's numbers, and is reported as
``avx2 kernels``.
"""

from __future__ import annotations

import os
from pathlib import Path

BF16_ISA_CLASSES = frozenset({"amx_bf16", "avx512_bf16"})  # the ``isa_class`` values whose kernels compute in bf16


def _cpuinfo() -> list[str]:
    try:
        return Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return []


def _field(name: str) -> str:
    """The value of the first /proc/cpuinfo line named ``name`` (``""`` if none)."""
    line = next((ln for ln in _cpuinfo() if ln.startswith(name)), "")
    return line.partition(":")[2].strip()


def cpu_flags() -> frozenset[str]:
    """This machine's CPU feature flags (Linux ``/proc/cpuinfo``; empty where there is none)."""
    return frozenset(_field("flags").split())


def cpu_model() -> str:
    return _field("model name") or "unknown CPU"


def cpu_vendor() -> str:
    """``GenuineIntel``, ``AuthenticAMD`` ...; empty where /proc/cpuinfo names none. The ISA class alone does not
    name the kernels: Intel's and AMD's AVX-512 CPUs train different default models (docs/results.md)."""
    return _field("vendor_id")


def isa_class(flags: frozenset[str] | None = None, env: dict[str, str] | None = None) -> str:
    """``avx2 kernels`` when PyTorch is held to AVX2, else the best class the flags show: ``amx_bf16``,
    ``avx512_bf16``, ``avx512`` or ``avx2``."""
    flags = cpu_flags() if flags is None else flags
    env = dict(os.environ) if env is None else env
    if env.get("ATEN_CPU_CAPABILITY", "").lower() in ("avx2", "default"):
        return "avx2 kernels"
    for name in sorted(BF16_ISA_CLASSES):  # amx_bf16 first
        if name in flags:
            return name
    return "avx512" if "avx512f" in flags else "avx2"


def available_cpus() -> int:
    """The CPUs this process may run on (its affinity: a container's or ``taskset``'s share), not the machine's."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def cpu_description() -> str:
    return f"{cpu_model()} ({isa_class()}), {os.cpu_count()} cores"
