"""The installed ``lifecycle`` script as a user runs it (tests/e2e): a user's shell environment, a home folder."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from core import runtime
from core.home import Home
from training.finetune.faults import FAULT_ENV, PAUSE_AFTER_FIRST_CHECKPOINT

EXE = Path(sys.executable).parent / "lifecycle"  # the script installed with this interpreter's environment


def paused_after_first_checkpoint(env: dict[str, str]) -> dict[str, str]:
    """``env`` in which every fine-tune rank waits for good after committing its first checkpoint, and says so in
    ``RUN_DIR/paused.rankN`` (the training fault seam, ``training.finetune.faults``)."""
    return {**env, FAULT_ENV: PAUSE_AFTER_FIRST_CHECKPOINT}


def ctrl_c_reaches_it() -> None:
    """``preexec_fn`` of a command a test stops with Ctrl-C (SIGINT): the signal's default action back in the child,
    so Python there installs its KeyboardInterrupt handler. A test run started in the background by a
    non-interactive shell (``nohup ... &``) has SIGINT ignored, and its children inherit that, as a user's would."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def user_env(home: Path) -> dict[str, str]:
    """A user's shell: none of our switches set (the CLI sets them), except the shared DeepSpeed op cache."""
    ours = set(runtime.runtime_environment(Home(home))) - {"TORCH_EXTENSIONS_DIR"}
    return {k: v for k, v in os.environ.items() if k not in ours and not k.startswith(("PREFECT_", "LIFECYCLE_"))}


def lifecycle(
    *args: str, home: Path, timeout: float = 900, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``lifecycle *args --home home`` in a user's shell, with ``env`` exported on top (a stack's addresses)."""
    assert EXE.is_file(), "the console script is installed with the project"
    return subprocess.run(
        [EXE, *args, "--home", str(home)],
        capture_output=True,
        text=True,
        env={**user_env(home), **(env or {})},
        timeout=timeout,
        check=False,
    )


def killed_mid_training(*args: str, home: Path, timeout: float = 900) -> None:
    """Start ``lifecycle *args`` and kill it, with everything it started (SIGKILL to its process group, as a crash
    or an OOM kill would), as soon as its fine-tune has written its first resumable checkpoint. The run pauses
    itself there (``paused_after_first_checkpoint``): it is mid-training when killed, however fast the machine."""
    proc = subprocess.Popen(
        [EXE, *args, "--home", str(home)],
        env=paused_after_first_checkpoint(user_env(home)),
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + timeout
    try:
        while not any(home.glob("models/runs/*/paused.rank0")):  # checkpoint committed, rank 0 waits (the fault)
            assert proc.poll() is None, f"lifecycle ended (exit {proc.returncode}) without pausing after a checkpoint"
            assert time.monotonic() < deadline, "no checkpoint written in time"
            time.sleep(0.05)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert not any(home.glob("models/runs/*/train_result.json")), "the fine-tune finished before the kill"
    # the ranks live in sessions of their own (torchrun's), out of the killed group's reach: they must follow it
    survivors = _processes_naming(str(home / "models" / "runs"))
    deadline = time.monotonic() + 30
    while survivors and time.monotonic() < deadline:
        time.sleep(0.1)
        survivors = _processes_naming(str(home / "models" / "runs"))
    assert not survivors, f"processes of the killed run still alive: {survivors}"


def _processes_naming(text: str) -> list[str]:
    """The command lines of this machine's live processes that contain ``text``."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            argv = cmdline.read_bytes().split(b"\0")
        except OSError:  # it ended while we looked
            continue
        line = " ".join(a.decode(errors="replace") for a in argv if a)
        if text in line:
            found.append(f"{cmdline.parent.name}: {line}")
    return found
