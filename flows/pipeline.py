"""The Prefect flow behind ``lifecycle run``: the loop's stages as tasks, in dependency order.

    lifecycle run --config configs/tiny.yaml

Stages so far: snapshot -> base model (bootstrap when none is configured). Each task is a thin wrapper around a
function in ``flows/stages.py``; the stages themselves are idempotent (content-addressed outputs), so a rerun
returns the existing snapshot and model at once.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.runtime import flow_run

from core.home import Home
from flows import stages
from flows.config import LifecycleConfig
from training.modelio import ModelFolder
from training.snapshot import Snapshot


@dataclass
class RunSummary:
    flow_run_id: str
    snapshot: str
    snapshot_counts: dict[str, int]
    base_model: str
    base_model_metrics: dict[str, Any]
    seconds: dict[str, float] = field(default_factory=dict)


@task(name="snapshot", task_run_name="snapshot")
def snapshot_task(cfg: LifecycleConfig, home: Home) -> Snapshot:
    snap = stages.snapshot_stage(cfg, home)
    get_run_logger().info("snapshot %s: %s", snap.short, snap.manifest["counts"])
    return snap


@task(name="base-model", task_run_name="base-model")
def base_model_task(cfg: LifecycleConfig, home: Home, snapshot: Snapshot) -> ModelFolder:
    model = stages.base_model_stage(cfg, home, snapshot)
    get_run_logger().info("base model %s", model.path)
    return model


@flow(name="lifecycle-run", log_prints=True)
def lifecycle_run(cfg: LifecycleConfig, home: Home) -> RunSummary:
    seconds: dict[str, float] = {}
    t = time.perf_counter()
    snap = snapshot_task(cfg, home)
    seconds["snapshot"] = time.perf_counter() - t
    t = time.perf_counter()
    model = base_model_task(cfg, home, snap)
    seconds["base_model"] = time.perf_counter() - t
    return RunSummary(
        flow_run_id=str(flow_run.get_id()),
        snapshot=snap.hash,
        snapshot_counts=dict(snap.manifest["counts"]),
        base_model=str(model.path),
        base_model_metrics=dict(model.manifest.get("metrics", {})),
        seconds=seconds,
    )
