"""A rank's resumable checkpoints: DeepSpeed's state plus the rank's RNG state, committed only once every rank wrote
its files (``latest`` names the tag), and read back on start."""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path
from typing import Any

import torch

from training.finetune.collectives import Collectives

log = logging.getLogger("lifecycle.train")
LATEST = "latest"  # the committed checkpoint's tag (DeepSpeed's load_checkpoint reads the same file)


def save(engine: Any, ckpt_dir: Path, step: int, rank: int, keep: int, comm: Collectives) -> None:
    """Write a checkpoint and only then commit it: ``latest`` names a tag once every rank's files (DeepSpeed's and
    our RNG state) are on disk. DeepSpeed's own ``latest`` is written by rank 0 as soon as rank 0 is done, while
    other ranks may still be writing, and before our RNG files: a kill in between left a checkpoint that could
    not be resumed."""
    tag = f"step{step:07d}"
    engine.save_checkpoint(str(ckpt_dir), tag=tag, client_state={"step": step}, save_latest=False)
    torch.save({"torch": torch.get_rng_state()}, ckpt_dir / tag / f"rng_rank{rank}.pt")
    comm.barrier()
    if rank == 0:
        pending = ckpt_dir / "latest.tmp"
        pending.write_text(tag)
        os.replace(pending, ckpt_dir / LATEST)  # atomic: a reader sees the old tag or the new one
        for old in sorted(p for p in ckpt_dir.glob("step*") if p.is_dir())[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
    comm.barrier()
    log.info("checkpoint %s", tag)


def resume(engine: Any, ckpt_dir: Path, rank: int) -> int:
    if not (ckpt_dir / LATEST).is_file():
        return 0
    path, client = engine.load_checkpoint(str(ckpt_dir))
    if path is None:
        return 0
    tag = (ckpt_dir / LATEST).read_text().strip()
    torch.set_rng_state(torch.load(ckpt_dir / tag / f"rng_rank{rank}.pt")["torch"])
    log.info("resumed from %s at step %d", tag, client["step"])
    return int(client["step"])
