"""Faults a fine-tune's ranks inject on purpose, for failure drills and the tests that kill a run mid-way: the
training side's seam, as ``serving.engines.faults`` is the gateway's.

    LIFECYCLE_TRAIN_FAULT=pause-after-first-checkpoint lifecycle train ...

``pause-after-first-checkpoint``: every rank, once this start of the run committed its first checkpoint, writes
``RUN_DIR/paused.rankN`` and waits for good, so a drill (or a test) can SIGKILL the run there and find it
mid-training on any machine; a fast machine would otherwise finish the remaining steps first. A waiting rank keeps
its exit-with-parent thread (``core.process.exit_with_parent``), so it dies with its launcher like a rank of a
crashed run. The variable travels to the ranks with the launcher's environment; unset, nothing happens.
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path

from core.errors import ConfigError

FAULT_ENV = "LIFECYCLE_TRAIN_FAULT"
PAUSE_AFTER_FIRST_CHECKPOINT = "pause-after-first-checkpoint"
FAULTS = (PAUSE_AFTER_FIRST_CHECKPOINT,)
log = logging.getLogger("lifecycle.train")


def active() -> str | None:
    """The fault this process injects (``FAULT_ENV``), or None; an unknown name is a clear error."""
    fault = os.environ.get(FAULT_ENV, "").strip() or None
    if fault is not None and fault not in FAULTS:
        raise ConfigError(f"{FAULT_ENV}={fault!r}: not a training fault (one of {', '.join(FAULTS)})")
    return fault


def after_checkpoint(run_dir: Path, rank: int, step: int, first: bool) -> None:
    """Called by every rank right after a checkpoint is committed."""
    if first and active() == PAUSE_AFTER_FIRST_CHECKPOINT:
        (run_dir / f"paused.rank{rank}").write_text(f"{os.getpid()} {step}\n")
        log.warning("fault %s: paused after the checkpoint at step %d", PAUSE_AFTER_FIRST_CHECKPOINT, step)
        threading.Event().wait()
