"""The stage functions the CLI commands and the Prefect tasks both call (no Prefect here).

Each takes the root config and the home folder, calls one stage's core function, and returns its typed result.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from core.home import Home
from flows.config import LifecycleConfig
from training.modelio import ModelFolder
from training.snapshot import Snapshot

if TYPE_CHECKING:
    from registry.store import MlflowRegistry, ModelVersion
    from training.finetune import TrainResult

CANDIDATE = "candidate"  # alias of the newest trained version, before any gate has looked at it


def preflight(cfg: LifecycleConfig, home: Home, snapshot_ref: str | None = None) -> None:
    """Check what the user controls before any orchestration starts, so bad input is one clear line."""
    from training.finetune import resolve_deepspeed_config
    from training.snapshot import load_snapshot, source_files

    resolve_deepspeed_config(cfg.finetune)
    if cfg.base_model:
        from training.modelio import inspect_model_folder

        inspect_model_folder(Path(cfg.base_model).expanduser().resolve())
    if snapshot_ref:
        load_snapshot(home.snapshots, snapshot_ref)
    elif cfg.data.sources:
        source_files([Path(s).expanduser().resolve() for s in cfg.data.sources])


def snapshot_stage(cfg: LifecycleConfig, home: Home, snapshot_ref: str | None = None) -> Snapshot:
    """An existing snapshot by hash (prefix), or the one the configured sources make (built if new)."""
    if snapshot_ref:
        from training.snapshot import load_snapshot

        return load_snapshot(home.snapshots, snapshot_ref)
    from training.dataset import make_snapshot

    return make_snapshot(cfg.data, cfg.snapshot, home)


def base_model_stage(
    cfg: LifecycleConfig, home: Home, snapshot: Snapshot | None, *, progress: bool = True
) -> ModelFolder:
    """The configured base model folder, or the one bootstrapped from ``snapshot`` (trained only if new)."""
    if cfg.base_model:
        from training.modelio import inspect_model_folder

        return inspect_model_folder(Path(cfg.base_model).expanduser().resolve())
    assert snapshot is not None, "bootstrapping a base model needs the snapshot it learns from"
    from training.bootstrap import bootstrap

    return bootstrap(cfg.bootstrap, snapshot, home.base_models, progress=progress)


def open_registry(cfg: LifecycleConfig, home: Home) -> MlflowRegistry:
    from registry.store import MlflowRegistry

    return MlflowRegistry(cfg.registry, home)


def _base_identity(base: ModelFolder) -> dict[str, str]:
    """Weights and tokenizer hashes of a base model, from its manifest or computed for an external folder."""
    from training.tokenizer import tokenizer_hashes

    tokenizer = (
        {k: str(base.manifest[k]) for k in ("tokenizer_hash", "chat_template_hash")}
        if base.manifest.get("tokenizer_hash")
        else tokenizer_hashes(base.path)
    )
    return {"weights_hash": base.identity, **tokenizer}


def register_base_stage(cfg: LifecycleConfig, home: Home, base: ModelFolder, *, flow_run_id: str) -> ModelVersion:
    from core.provenance import git_sha
    from registry.lineage import register_base_model

    curve_file = base.path / "loss_curve.json"
    curve = json.loads(curve_file.read_text())["train"] if curve_file.is_file() else []
    manifest = {"kind": "external", **base.manifest, **_base_identity(base)}
    return register_base_model(
        open_registry(cfg, home),
        folder=base.path,
        manifest=manifest,
        curve=curve,
        git_sha=git_sha(),
        flow_run_id=flow_run_id,
    )


def finetune_stage(cfg: LifecycleConfig, home: Home, snapshot: Snapshot, base: ModelFolder) -> TrainResult:
    """Fine-tune in ``$LIFECYCLE_HOME/models/runs/<train key>``: a rerun resumes or returns the finished run."""
    from training.finetune import finetune, train_key

    return finetune(cfg.finetune, snapshot, base, home.runs / train_key(cfg.finetune, snapshot, base))


def register_stage(
    cfg: LifecycleConfig,
    home: Home,
    snapshot: Snapshot,
    base: ModelFolder,
    base_version: ModelVersion,
    result: TrainResult,
    *,
    flow_run_id: str,
) -> ModelVersion:
    """Log the training run, register the version with its lineage and point ``candidate`` at it."""
    from core.config import dump_yaml
    from core.hashing import sha256_json
    from core.provenance import git_sha
    from registry.lineage import Lineage, register
    from training.finetune import resolve_deepspeed_config, train_key
    from training.tokenizer import tokenizer_hashes

    reg = open_registry(cfg, home)
    key = train_key(cfg.finetune, snapshot, base)
    existing = reg.find(cfg.registry.model_name, lineage_train_key=key)
    if existing:
        return existing[0]
    ds_path, ds = resolve_deepspeed_config(cfg.finetune)
    lineage = Lineage(
        snapshot=snapshot.hash,
        base_model=base_version.ref,
        base_weights_hash=_base_identity(base)["weights_hash"],
        config_hash=cfg.finetune.config_hash(),
        deepspeed_config=ds_path.name,
        deepspeed_config_hash=sha256_json(ds),
        seed=cfg.finetune.seed,
        git_sha=git_sha(),
        **tokenizer_hashes(result.export_dir),
        weights_hash=result.weights_hash,
        flow_run_id=flow_run_id,
        method=result.method,
        train_key=key,
    )
    run_dir = result.run_dir
    (run_dir / "config.yaml").write_text(dump_yaml(cfg), encoding="utf-8")
    (run_dir / "deepspeed.json").write_text(json.dumps(ds, indent=2) + "\n", encoding="utf-8")
    metrics = result.metrics
    summary = {
        "metrics.val_loss": f"{metrics['val_loss']:.4f}",
        "metrics.val_loss_initial": f"{metrics['val_loss_initial']:.4f}",
        "metrics.tokens_per_s": f"{metrics['tokens_per_s']:.0f}",
        "check.max_abs_logit_diff": f"{result.equivalence['max_abs_logit_diff']:.3g}",
        "check.atol": str(result.equivalence["atol"]),
    }
    version = register(
        reg,
        lineage=lineage,
        export_dir=result.export_dir,
        config=cfg.model_dump(mode="json"),
        curve=result.curve(),
        artifacts={
            "config": run_dir / "config.yaml",
            "deepspeed": run_dir / "deepspeed.json",
            "snapshot": snapshot.path / "manifest.json",
            "training": run_dir / "train_result.json",
            "logs": run_dir / "logs",
        },
        summary=summary,
    )
    reg.set_alias(
        version.name,
        CANDIDATE,
        version.version,
        actor=f"flow-run:{flow_run_id}",
        reason=f"fine-tuned ({result.method}) on snapshot {snapshot.short}; awaiting the eval gate",
    )
    return reg.get(version.name, version.version)
