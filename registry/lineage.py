"""Lineage records and registration of trained models: ``register(...) -> ModelVersion``.

Every registered version carries ``lineage.*`` tags (see :class:`Lineage`) so any answer the endpoint gives
traces back to its snapshot, base model, config, code and orchestration run. Registration is idempotent on a
content key (``lineage.train_key`` for fine-tunes, ``lineage.weights_hash`` for base models): registering the
same result twice returns the existing version.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from registry.store import MlflowRegistry, ModelVersion


@dataclass(frozen=True)
class Lineage:
    snapshot: str
    base_model: str  # a registered version ("chat-base/1") or a folder
    base_weights_hash: str
    config_hash: str
    deepspeed_config: str
    deepspeed_config_hash: str
    seed: int
    git_sha: str
    tokenizer_hash: str
    chat_template_hash: str
    weights_hash: str
    flow_run_id: str
    method: str
    train_key: str
    # a preference-tuned version only: the SFT version it started from, its pair snapshot, the frozen reference
    # model (a registered version or a folder) and that model's weights; ``snapshot`` stays its SFT parent's chat
    # snapshot (the data its eval sets are held out from), so both are gated on the same items
    objective: str = "sft"
    sft_parent: str | None = None
    preference_snapshot: str | None = None
    reference_model: str | None = None
    reference_weights_hash: str | None = None

    def tags(self) -> dict[str, str]:
        return {f"lineage.{k}": str(v) for k, v in asdict(self).items() if v is not None}


# the tags every fine-tuned version carries; a preference-tuned one carries PREFERENCE_TAGS too
LINEAGE_TAGS = tuple(f"lineage.{f.name}" for f in fields(Lineage) if f.default is not None)
PREFERENCE_TAGS = tuple(f"lineage.{f.name}" for f in fields(Lineage) if f.default is None)


def register_base_model(
    reg: MlflowRegistry,
    *,
    folder: Path,
    manifest: dict[str, Any],
    curve: list[dict[str, Any]],
    git_sha: str,
    flow_run_id: str,
) -> ModelVersion:
    """Register a base model folder (once per weights hash) so fine-tunes can point at a registered version; an
    imported one (``training.model.pretrained``) carries its source as ``lineage.source.*`` tags."""
    name = reg.cfg.base_model_name
    weights = str(manifest.get("weights_hash", ""))
    if weights:
        existing = reg.find(name, lineage_weights_hash=weights)
        if existing:
            return existing[0]
    tags = {
        "lineage.kind": str(manifest.get("kind", "external")),
        "lineage.snapshot": str(manifest.get("snapshot", "")),
        "lineage.weights_hash": weights,
        "lineage.tokenizer_hash": str(manifest.get("tokenizer_hash", "")),
        "lineage.chat_template_hash": str(manifest.get("chat_template_hash", "")),
        "lineage.config_hash": str(manifest.get("config_hash", "")),
        "lineage.seed": str(manifest.get("seed", "")),
        "lineage.git_sha": git_sha,
        "lineage.flow_run_id": flow_run_id,
        "lineage.path": str(folder),
        # an imported base: where its bytes came from (package, version, file SHA-256, license, converter)
        **{f"lineage.source.{k}": str(v) for k, v in manifest.get("source", {}).items()},
    }
    run_id = reg.log_run(
        run_name=f"{'import' if manifest.get('kind') == 'imported' else 'bootstrap'}-{folder.name}",
        params={"bootstrap": manifest.get("config", {})},
        metrics=curve,
        artifacts={"model": folder},
        tags={"lifecycle.stage": "bootstrap"},
    )
    metrics = {
        f"metrics.{k}": f"{v:.6g}" if isinstance(v, float) else str(v) for k, v in manifest.get("metrics", {}).items()
    }
    return reg.register(
        name,
        run_id,
        "model",
        {**tags, **metrics},
        description="Base models that chat fine-tunes start from (bootstrapped or external).",
    )


def register(
    reg: MlflowRegistry,
    *,
    lineage: Lineage,
    export_dir: Path,
    config: dict[str, Any],
    curve: list[dict[str, Any]],
    artifacts: dict[str, Path],
    summary: dict[str, str],
) -> ModelVersion:
    """One MLflow run for the training (config params, loss curves, artifacts) and its registered version (the
    run's stage is the objective: finetune for SFT, preference for DPO)."""
    name = reg.cfg.model_name
    existing = reg.find(name, lineage_train_key=lineage.train_key)
    if existing:
        return existing[0]
    stage = "finetune" if lineage.objective == "sft" else "preference"
    run_id = reg.log_run(
        run_name=f"{stage}-{lineage.train_key}",
        params=config,
        metrics=curve,
        artifacts={"model": export_dir, **artifacts},
        tags={"lifecycle.stage": stage, **lineage.tags()},
    )
    return reg.register(
        name, run_id, "model", {**lineage.tags(), **summary}, description="Chat models fine-tuned by chat-lifecycle."
    )


def register_quantized(
    reg: MlflowRegistry,
    parent: ModelVersion,
    *,
    folder: Path,
    manifest: dict[str, Any],
    snapshot: str,
    git_sha: str,
    flow_run_id: str,
) -> ModelVersion:
    """Register a quantized variant of ``parent`` as a chat version (once per quantized weights): its lineage names
    the parent and the method, and keeps the parent's ``snapshot`` so the gate measures both on the same items."""
    name = reg.cfg.model_name
    weights = str(manifest["weights_hash"])
    existing = reg.find(name, lineage_weights_hash=weights)
    if existing:
        return existing[0]
    tags = {
        "lineage.kind": "quantized",
        "lineage.parent": parent.ref,
        "lineage.parent_weights_hash": str(manifest["parent_weights_hash"]),
        "lineage.method": str(manifest["method"]),
        "lineage.quantizer": str(manifest["quantization"]["quantizer"]),
        "lineage.snapshot": snapshot,
        "lineage.weights_hash": weights,
        "lineage.tokenizer_hash": str(manifest.get("tokenizer_hash", parent.lineage.get("tokenizer_hash", ""))),
        "lineage.chat_template_hash": str(
            manifest.get("chat_template_hash", parent.lineage.get("chat_template_hash", ""))
        ),
        "lineage.git_sha": git_sha,
        "lineage.flow_run_id": flow_run_id,
    }
    run_id = reg.log_run(
        run_name=f"quantize-{folder.name}",
        params={"quantization": manifest["quantization"]},
        metrics=[],
        artifacts={"model": folder},
        tags={"lifecycle.stage": "quantize", **tags},
    )
    metrics = {f"metrics.{k}": str(v) for k, v in manifest.get("metrics", {}).items()}
    return reg.register(
        name, run_id, "model", {**tags, **metrics}, description="Chat models fine-tuned by chat-lifecycle."
    )
