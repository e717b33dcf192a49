"""The ``train`` flow: snapshot -> base model -> (self-replies) -> fine-tune -> register, then with
``preference.enabled`` pair snapshot -> DPO -> register the aligned version (``lifecycle train``, and the loop's
first step). With ``finetune.self_replies.enabled`` the fine-tune trains on the snapshot derived with the base
model's own replies (``training/data/self_replies.py``), and that snapshot is the version's ``lineage.snapshot``.

    lifecycle train                                    # SFT, then the preference stage on top (the default)
    lifecycle train --set preference.enabled=false     # SFT only
    lifecycle train --config configs/tiny.yaml         # seconds-scale sizes, SFT only

Tasks are thin wrappers over ``flows/stages.py``. The fine-tune task is cached on its inputs (the train key:
snapshot, base weights, fine-tune and DeepSpeed config), so the same inputs return the finished run instead of
training again; it retries once after a crash and resumes from its last checkpoint. Registration happens only
after the export passed its equivalence check, so a failed or killed run leaves no registered version. The
preference stage works the same way (``flows/preference.py``); its version, not the SFT parent, is the flow's
result and holds the ``candidate`` alias.
"""

from __future__ import annotations

import time
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact
from prefect.context import TaskRunContext
from prefect.runtime import flow_run

from core.hashing import sha256_text
from core.home import Home
from flows import preference, stages
from flows.config import LifecycleConfig
from flows.summaries import TrainSummary
from registry.store import ModelVersion
from training.data.snapshot import Snapshot
from training.finetune.launch import TrainResult, resumable_step, train_key
from training.model.modelio import ModelFolder


@task(name="snapshot")
def snapshot_task(cfg: LifecycleConfig, home: Home, snapshot_ref: str | None = None) -> Snapshot:
    snap = stages.snapshot_stage(cfg, home, snapshot_ref)
    get_run_logger().info("snapshot %s: %s", snap.short, snap.manifest["counts"])
    return snap


@task(name="base-model")
def base_model_task(cfg: LifecycleConfig, home: Home, snapshot: Snapshot) -> ModelFolder:
    model = stages.base_model_stage(cfg, home, snapshot)
    get_run_logger().info("base model %s", model.path)
    return model


@task(name="self-replies")
def self_replies_task(cfg: LifecycleConfig, home: Home, snapshot: Snapshot, base: ModelFolder) -> Snapshot:
    derived = stages.self_replies_stage(cfg, home, snapshot, base)
    info = derived.manifest.get("self_replies", {})
    get_run_logger().info(
        "self-replies: snapshot %s from %s, %s base replies, %s kept generated %s",
        derived.short,
        snapshot.short,
        info.get("replaced", {}).get("total", 0),
        info.get("kept", {}).get("total", 0),
        info.get("kept", {}).get("by_reason", {}),
    )
    return derived


@task(name="register-base")
def register_base_task(cfg: LifecycleConfig, home: Home, base: ModelFolder, flow_run_id: str) -> ModelVersion:
    version = stages.register_base_stage(cfg, home, base, flow_run_id=flow_run_id)
    get_run_logger().info("base model registered as %s", version.ref)
    return version


def _train_cache_key(context: TaskRunContext, parameters: dict[str, Any]) -> str:
    """The train key plus the home's runs folder: the cached result names a run folder, so two homes sharing
    Prefect's result storage (a test session, a shared server) must not hand each other their runs."""
    runs = sha256_text(str(parameters["home"].runs))[:12]
    return f"finetune-{train_key(parameters['cfg'].finetune, parameters['snapshot'], parameters['base'])}-{runs}"


@task(name="finetune", cache_key_fn=_train_cache_key, persist_result=True, retries=1, retry_delay_seconds=5)
def finetune_task(cfg: LifecycleConfig, home: Home, snapshot: Snapshot, base: ModelFolder) -> TrainResult:
    logger = get_run_logger()
    run_dir = stages.train_run_dir(cfg, home, snapshot, base)
    if step := resumable_step(run_dir):
        logger.info("resumed from the checkpoint at step %d of the unfinished run %s", step, run_dir.name[:12])
    result = stages.finetune_stage(cfg, home, snapshot, base)
    logger.info(
        "fine-tuned %s: val loss %.3f -> %.3f, logits max diff %.2g",
        result.method,
        result.metrics["val_loss_initial"],
        result.metrics["val_loss"],
        result.equivalence["max_abs_logit_diff"],
    )
    return result


@task(name="register")
def register_task(
    cfg: LifecycleConfig,
    home: Home,
    snapshot: Snapshot,
    base: ModelFolder,
    base_version: ModelVersion,
    result: TrainResult,
    flow_run_id: str,
) -> ModelVersion:
    version = stages.register_stage(cfg, home, snapshot, base, base_version, result, flow_run_id=flow_run_id)
    get_run_logger().info("registered %s (aliases: %s)", version.ref, ", ".join(version.aliases) or "-")
    return version


@task(name="pair-snapshot")
def pair_snapshot_task(cfg: LifecycleConfig, home: Home, sft: ModelVersion, feedback: bool) -> Snapshot:
    pairs = preference.pair_snapshot_stage(cfg, home, sft.lineage["snapshot"], feedback=feedback, sft=sft)
    logger = get_run_logger()
    logger.info(
        "pair snapshot %s: %s (feedback: %s)",
        pairs.short,
        pairs.manifest["counts"],
        pairs.manifest["provenance"]["feedback"],
    )
    if on_policy := pairs.manifest["provenance"].get("on_policy"):
        logger.info(
            "on-policy pairs of %s: drawn %s, paired %s, rejected reply from %s, no pair: %s",
            on_policy["policy"],
            on_policy["drawn"],
            on_policy["paired"],
            on_policy["rejected_from"],
            on_policy["unpaired"],
        )
    return pairs


def _dpo_cache_key(context: TaskRunContext, parameters: dict[str, Any]) -> str:
    runs = sha256_text(str(parameters["home"].runs))[:12]
    return f"dpo-{parameters['job'].key(parameters['cfg'])}-{runs}"


@task(name="dpo", cache_key_fn=_dpo_cache_key, persist_result=True, retries=1, retry_delay_seconds=5)
def dpo_task(cfg: LifecycleConfig, home: Home, job: preference.PreferenceJob) -> TrainResult:
    logger = get_run_logger()
    if step := resumable_step(job.run_dir(cfg, home)):
        logger.info("resumed the preference stage from its checkpoint at step %d", step)
    result = preference.preference_stage(cfg, home, job)
    m = result.metrics
    logger.info(
        "preference-tuned (dpo, beta %g): val loss %.3f -> %.3f, reward accuracy %.2f -> %.2f",
        job.spec.beta,
        m["val_loss_initial"],
        m["val_loss"],
        m["val_reward_accuracy_initial"],
        m["val_reward_accuracy"],
    )
    return result


@task(name="register-aligned")
def register_aligned_task(
    cfg: LifecycleConfig, home: Home, job: preference.PreferenceJob, result: TrainResult, flow_run_id: str
) -> ModelVersion:
    version = preference.register_preference_stage(cfg, home, job, result, flow_run_id=flow_run_id)
    get_run_logger().info("registered the aligned %s (SFT parent %s)", version.ref, job.sft.ref)
    return version


def _preference(
    cfg: LifecycleConfig, home: Home, sft: ModelVersion, run_id: str, feedback: bool, seconds: dict[str, float]
) -> tuple[ModelVersion, TrainResult]:
    t = time.perf_counter()
    pairs = pair_snapshot_task(cfg, home, sft, feedback)
    job = preference.preference_job(cfg, home, sft, pairs)
    result = dpo_task(cfg, home, job)
    version = register_aligned_task(cfg, home, job, result, run_id)
    seconds["preference"] = time.perf_counter() - t
    return version, result


@flow(name="train")
def train_flow(
    cfg: LifecycleConfig, home: Home, snapshot_ref: str | None = None, feedback: bool = False
) -> TrainSummary:
    """SFT (and with ``preference.enabled`` the preference stage); ``feedback``: the pair snapshot may take the
    curated feedback pairs (a retrain)."""
    run_id = str(flow_run.get_id())
    seconds: dict[str, float] = {}
    t = time.perf_counter()
    snap = snapshot_task(cfg, home, snapshot_ref)
    seconds["snapshot"], t = time.perf_counter() - t, time.perf_counter()
    base = base_model_task(cfg, home, snap)
    seconds["base_model"], t = time.perf_counter() - t, time.perf_counter()
    if cfg.finetune.self_replies.enabled:
        snap = self_replies_task(cfg, home, snap, base)
        seconds["self_replies"], t = time.perf_counter() - t, time.perf_counter()
    base_version = register_base_task(cfg, home, base, run_id)
    result = finetune_task(cfg, home, snap, base)
    seconds["finetune"], t = time.perf_counter() - t, time.perf_counter()
    version = register_task(cfg, home, snap, base, base_version, result, run_id)
    seconds["register"] = time.perf_counter() - t
    sft_metrics = sft_parent = None
    if cfg.preference.enabled:
        sft_parent, sft_metrics = version.ref, dict(result.metrics)
        version, result = _preference(cfg, home, version, run_id, feedback, seconds)
    summary = TrainSummary(
        flow_run_id=run_id,
        snapshot=snap.hash,
        snapshot_counts=dict(snap.manifest["counts"]),
        base_model=str(base.path),
        base_model_version=base_version.ref,
        base_model_metrics=dict(base.manifest.get("metrics", {})),
        model=version.name,
        version=version.version,
        lineage=version.lineage,
        metrics=dict(result.metrics),
        seconds=seconds,
        sft_parent=sft_parent,
        sft_metrics=sft_metrics,
    )
    create_markdown_artifact(key="train-summary", markdown=_markdown(summary), description="Fine-tune result")
    return summary


def _markdown(s: TrainSummary) -> str:
    rows = "\n".join(f"| {k} | `{v}` |" for k, v in s.lineage.items())
    return (
        f"# {s.model}/{s.version}\n\nval loss {s.metrics['val_loss_initial']:.3f} → {s.metrics['val_loss']:.3f}, "
        f"{s.metrics['tokens_per_s']:.0f} tokens/s\n\n| lineage | value |\n|---|---|\n{rows}\n"
    )
