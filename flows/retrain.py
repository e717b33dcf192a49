"""The retrain: one ``retrain`` flow (curated snapshot -> train -> gate -> an ending) and the scheduled
``retrain-check`` flow that decides whether to run it.

    lifecycle retrain                  # monitor, curate, decide; when triggered: retrain, the version the challenger
    lifecycle retrain --dry-run        # the decision only
    lifecycle run                      # the loop: its drift check may trigger a retrain ending in a simulated rollout

A triggered retrain builds a snapshot with the curated conversations and takes the same path as any version:
train (with ``preference.enabled``, DPO on pairs that include the curated feedback pairs once there are
``preference.feedback_min_pairs`` of them) -> evaluate and gate; a version that fails its gate stops there. One
that passes ends as the caller says (``RetrainEnding``): under simulated users (``lifecycle run``), or as the
challenger the rollout controller takes on real users (the nightly check, ``lifecycle retrain``).
"""

from __future__ import annotations

from typing import Any

from prefect import flow, get_run_logger
from prefect.runtime import flow_run

from core.home import Home
from flows.config import LifecycleConfig
from flows.evaluate import evaluate_flow
from flows.lock import attempt_guard, held_lock, lock_name
from flows.monitor import publish_drift
from flows.rollout import promote, simulated_rollout_task
from flows.signals import retrain_check_stage, retrain_snapshot, tag_retrained
from flows.summaries import RetrainEnding, RetrainSummary
from flows.train import train_flow


@flow(name="retrain")
def retrain_flow(
    cfg: LifecycleConfig, home: Home, reasons: list[str], ending: RetrainEnding = "simulated-rollout"
) -> RetrainSummary:
    """A triggered retrain: a snapshot with the curated conversations -> train -> gate, then the ``ending`` of a
    version that passed: ``simulated-rollout`` (when ``run.rollout``) or ``challenger``."""
    logger = get_run_logger()
    snap = retrain_snapshot(cfg, home)
    logger.info("retrain on snapshot %s (%s)", snap.short, "; ".join(reasons))
    trained = train_flow(cfg, home, snapshot_ref=snap.hash, feedback=True)  # feedback pairs, when enough
    tag_retrained(cfg, home, trained.version, reasons)
    gated = evaluate_flow(cfg, home, f"{trained.model}/{trained.version}")
    rolled = None
    if not gated.passed:
        logger.warning("the retrained version %s/%s failed its gate: %s", trained.model, trained.version, gated.summary)
    elif ending == "challenger":
        promote(cfg, home, trained.model, trained.version, reason="drift retrain: gate passed", force=False)
    elif cfg.run.rollout:
        rolled = simulated_rollout_task(cfg, home, trained.model, trained.version)
    return RetrainSummary(snap.hash, trained, gated, rolled)


@flow(name="retrain-check")
def retrain_check_flow(cfg: LifecycleConfig, home: Home, dry_run: bool = False) -> dict[str, Any]:
    """Monitor, curate, decide; a triggered retrain (``retrain_flow``) trains on the curated snapshot, gates the
    version and, when it passes, makes it the challenger (the rollout controller takes it from there, on real
    users)."""
    attempt_guard(cfg.schedule.crash_retries)
    logger = get_run_logger()
    # one check (and the retrain it may start) at a time, even when Prefect wrongly believes an earlier one dead
    with held_lock(lock_name("retrain", cfg.registry.model_name), lease_s=cfg.schedule.lock_lease_s):
        check = retrain_check_stage(cfg, home, actor=f"flow-run:{flow_run.get_id()}")
        publish_drift(check.monitor)
        logger.info("%s", check.decision.summary)
        out = check.to_json()
        if not check.decision.retrain or dry_run:
            return out
        retrained = retrain_flow(cfg, home, check.decision.reasons, ending="challenger")
    out["retrained"] = {
        "version": retrained.train.version,
        "snapshot": retrained.snapshot,
        "gate": retrained.gate.summary,
    }
    if retrained.gate.passed:
        out["retrained"]["challenger"] = True
    return out
