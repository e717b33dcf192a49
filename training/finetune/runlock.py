"""Who may write a fine-tune's run folder: one launch at a time, and never while ranks of an earlier launch live.

A launch (``training.finetune.launch``) holds ``.launch.lock`` exclusively for as long as it runs, and before it starts
its ranks it waits until it can take ``.ranks.lock`` exclusively: each rank (``training.finetune.worker``) holds that
one shared for its whole life. So a rerun after a crash or a kill -9 waits for any rank the crash left behind
instead of training beside it in the same folder (torchrun starts ranks in sessions of their own: a signal to
the launcher's process group does not reach them). The locks are ``flock`` locks: the kernel releases them when
their holder dies, however it dies.
"""

from __future__ import annotations

import fcntl
import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

log = logging.getLogger("lifecycle.train")
LAUNCH_LOCK = ".launch.lock"
RANKS_LOCK = ".ranks.lock"


def _acquire(path: Path, mode: int, waiting: str) -> int:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, mode | fcntl.LOCK_NB)
    except BlockingIOError:
        log.warning(waiting)
        fcntl.flock(fd, mode)  # blocks until the holder ends (or dies)
    return fd


@contextmanager
def exclusive_launch(run_dir: Path) -> Iterator[None]:
    """Hold the run folder for one launch; returns once no rank of an earlier launch is alive."""
    run_dir.mkdir(parents=True, exist_ok=True)
    launch = _acquire(run_dir / LAUNCH_LOCK, fcntl.LOCK_EX, f"waiting for another fine-tune launch in {run_dir}")
    try:
        ranks = _acquire(
            run_dir / RANKS_LOCK, fcntl.LOCK_EX, f"waiting for ranks of an earlier launch in {run_dir} to exit"
        )
        os.close(ranks)  # none alive: the new ranks take it shared
        yield
    finally:
        os.close(launch)


def hold_as_rank(run_dir: Path) -> int:
    """Taken by every rank at start and held until it exits (the returned descriptor is never closed)."""
    return _acquire(run_dir / RANKS_LOCK, fcntl.LOCK_SH, f"rank waiting on {run_dir / RANKS_LOCK}")
