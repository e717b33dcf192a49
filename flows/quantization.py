"""The quantize stage: a registered version into a quantized one, registered as a new chat version whose lineage
names its parent and the method (``training.model.quantize``), then gated against that parent like any candidate.

    quantize_stage(cfg, home, "chat/3", flow_run_id="cli")   # -> chat/N, lineage.parent=chat/3
"""

from __future__ import annotations

from pathlib import Path

from core.errors import NotFoundError
from core.home import Home
from core.provenance import git_sha
from flows.config import LifecycleConfig
from flows.gating import eval_target
from flows.stages import open_registry
from registry.lineage import register_quantized
from registry.store import ModelVersion
from training.data.snapshot import load_snapshot
from training.model.modelio import inspect_model_folder
from training.model.quantize import quantize


def quantized_root(home: Home) -> Path:
    return home.root / "models" / "quantized"


def quantize_stage(
    cfg: LifecycleConfig, home: Home, ref: str, *, snapshot: str | None = None, flow_run_id: str
) -> ModelVersion:
    """Quantize ``ref`` by ``cfg.quantize`` and register the result (idempotent: the same parent and method give
    the same version). The new version keeps the parent's snapshot, so its gate sees the parent's eval items;
    ``snapshot`` names one for a parent without it (an imported base)."""
    reg = open_registry(cfg, home)
    parent = reg.parse(ref)
    held_out = snapshot or parent.lineage.get("snapshot")
    if not held_out:
        raise NotFoundError(f"{parent.ref} has no lineage.snapshot; pass --snapshot HASH (the eval data to gate on)")
    held_out = load_snapshot(home.snapshots, held_out).hash  # a prefix resolves, an unknown one fails here
    folder = inspect_model_folder(eval_target(cfg, home, parent.ref)[1].folder)  # LoRA: merged into its base
    made = quantize(folder, quantized_root(home), cfg.quantize)
    return register_quantized(
        reg,
        parent,
        folder=made.path,
        manifest=made.manifest,
        snapshot=held_out,
        git_sha=git_sha(),
        flow_run_id=flow_run_id,
    )
