"""The stage functions the CLI commands and the Prefect tasks both call (no Prefect here).

Each takes the root config and the home folder, calls one stage's core function, and returns its typed result.
"""

from __future__ import annotations

from pathlib import Path

from core.home import Home
from flows.config import LifecycleConfig
from training.modelio import ModelFolder
from training.snapshot import Snapshot


def snapshot_stage(cfg: LifecycleConfig, home: Home) -> Snapshot:
    from training.dataset import make_snapshot

    return make_snapshot(cfg.data, cfg.snapshot, home)


def base_model_stage(cfg: LifecycleConfig, home: Home, snapshot: Snapshot, *, progress: bool = True) -> ModelFolder:
    """The configured base model folder, or the bootstrapped one (trained only if it does not exist yet)."""
    if cfg.base_model:
        from training.modelio import inspect_model_folder

        return inspect_model_folder(Path(cfg.base_model).expanduser().resolve())
    from training.bootstrap import bootstrap

    return bootstrap(cfg.bootstrap, snapshot, home.base_models, progress=progress)
