"""The installed ``lifecycle`` script as a user runs it (tests/e2e): a user's shell environment, a home folder."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from core import runtime
from core.home import Home

EXE = Path(sys.executable).parent / "lifecycle"  # the script installed with this interpreter's environment


def user_env(home: Path) -> dict[str, str]:
    """A user's shell: none of our switches set (the CLI sets them), except the shared DeepSpeed op cache."""
    ours = set(runtime.runtime_environment(Home(home))) - {"TORCH_EXTENSIONS_DIR"}
    return {k: v for k, v in os.environ.items() if k not in ours and not k.startswith(("PREFECT_", "LIFECYCLE_"))}


def lifecycle(*args: str, home: Path, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    assert EXE.is_file(), "the console script is installed with the project"
    return subprocess.run(
        [EXE, *args, "--home", str(home)],
        capture_output=True,
        text=True,
        env=user_env(home),
        timeout=timeout,
        check=False,
    )
