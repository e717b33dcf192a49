"""The ``safety-classifier`` flow: harm snapshot -> train + register (``candidate``) -> gate (recorded on the
version); ``lifecycle safety-classifier train`` runs it, ``... promote`` moves the champion afterwards.

    lifecycle safety-classifier train                       # generator data, gated against the champion
    lifecycle safety-classifier train --source red_team.jsonl
    lifecycle safety-classifier canary                      # the ``safety-classifier-canary`` flow: one decision

Tasks are thin wrappers over ``flows.classifier_stages``.
"""

from __future__ import annotations

from dataclasses import dataclass

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact
from prefect.runtime import flow_run

from core.home import Home
from flows import classifier_stages as stages
from flows.config import LifecycleConfig
from registry.store import ModelVersion
from training.data.snapshot import Snapshot


@dataclass(frozen=True)
class ClassifierSummary:
    flow_run_id: str
    model: str
    version: str
    snapshot: str
    threshold: float
    gate_passed: bool | None
    gate_summary: str
    metrics: dict[str, float]


@task(name="harm-snapshot")
def harm_snapshot_task(cfg: LifecycleConfig, home: Home, ref: str | None) -> Snapshot:
    snap = stages.harm_snapshot_stage(cfg, home, ref)
    get_run_logger().info("harm snapshot %s: %s", snap.short, snap.manifest["counts"])
    return snap


@task(name="train-classifier")
def train_classifier_task(cfg: LifecycleConfig, home: Home, snap: Snapshot, run_id: str) -> ModelVersion:
    version = stages.train_classifier_stage(cfg, home, snap, flow_run_id=run_id)
    get_run_logger().info("registered %s (threshold %s)", version.ref, version.lineage.get("threshold"))
    return version


@task(name="gate-classifier")
def gate_classifier_task(cfg: LifecycleConfig, home: Home, ref: str, run_id: str) -> stages.ClassifierGate:
    outcome = stages.classifier_gate_stage(cfg, home, ref, actor=f"flow-run:{run_id}")
    logger = get_run_logger()
    (logger.info if outcome.decision.passed else logger.warning)("gate %s: %s", ref, outcome.decision.summary)
    return outcome


@flow(name="safety-classifier")
def safety_classifier_flow(
    cfg: LifecycleConfig, home: Home, snapshot_ref: str | None = None, gate: bool = True
) -> ClassifierSummary:
    """Snapshot, train, register and (with ``gate``) gate one safety-classifier version."""
    run_id = str(flow_run.get_id() or "local")
    snap = harm_snapshot_task(cfg, home, snapshot_ref)
    version = train_classifier_task(cfg, home, snap, run_id)
    outcome = gate_classifier_task(cfg, home, version.ref, run_id) if gate else None
    if outcome is not None:
        create_markdown_artifact(key="safety-classifier-gate", markdown=outcome.markdown)
    return ClassifierSummary(
        flow_run_id=run_id,
        model=version.name,
        version=version.version,
        snapshot=snap.hash,
        threshold=float(version.lineage["threshold"]),
        gate_passed=outcome.decision.passed if outcome else None,
        gate_summary=outcome.decision.summary if outcome else "not gated",
        metrics=outcome.report.summary() if outcome else {},
    )


@flow(name="safety-classifier-canary")
def safety_classifier_canary_flow(cfg: LifecycleConfig, home: Home) -> stages.CanaryOutcome:
    """One decision on the safety-classifier version in canary (``lifecycle safety-classifier canary``; schedule
    it like the rollout controller): promote, roll back or hold, recorded on the version and in the audit log."""
    run_id = str(flow_run.get_id() or "local")
    outcome = stages.classifier_canary_stage(cfg, home, actor=f"flow:{run_id}")
    logger = get_run_logger()
    (logger.warning if outcome.action in ("rollback", "rejected") else logger.info)(
        "classifier canary %s: %s (%s)", outcome.canary or "-", outcome.action, outcome.reason
    )
    stats = "".join(f"| {k} | {v} |\n" for k, v in outcome.stats.items())
    create_markdown_artifact(
        key="safety-classifier-canary",
        markdown=f"# Classifier canary {outcome.canary or '(none)'}: {outcome.action}\n\n"
        f"Champion: {outcome.champion or '-'}\n\n{outcome.reason}\n\n"
        + (f"| figure | value |\n|---|---|\n{stats}" if stats else ""),
    )
    return outcome
