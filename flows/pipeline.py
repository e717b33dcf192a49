"""Prefect flows: ``train`` (snapshot -> base model -> fine-tune -> register), ``evaluate`` (eval suites ->
gate decision -> recorded on the version), ``champion-eval`` (daily), ``retrain`` (curated snapshot -> train ->
gate -> rollout) and ``lifecycle-run`` (the loop: train, gate, rollout, drift check, retrain when triggered).

    lifecycle train --config configs/tiny.yaml
    lifecycle gate chat 3
    lifecycle run

Tasks are thin wrappers over ``flows/stages.py``. The fine-tune task is cached on its inputs (the train key:
snapshot, base weights, fine-tune and DeepSpeed config), so the same inputs return the finished run instead of
training again; it retries once after a crash and resumes from its last checkpoint. Registration happens only
after the export passed its equivalence check, so a failed or killed run leaves no registered version.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact
from prefect.context import TaskRunContext
from prefect.runtime import flow_run

from core.hashing import sha256_text
from core.home import Home
from flows import stages
from flows.config import LifecycleConfig
from registry.store import ModelVersion
from training.finetune import TrainResult, train_key
from training.modelio import ModelFolder
from training.snapshot import Snapshot


@dataclass
class TrainSummary:
    flow_run_id: str
    snapshot: str
    snapshot_counts: dict[str, int]
    base_model: str
    base_model_version: str
    base_model_metrics: dict[str, Any]
    model: str
    version: str
    lineage: dict[str, str]
    metrics: dict[str, Any]
    seconds: dict[str, float] = field(default_factory=dict)


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
    from training.finetune import resumable_step

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


@flow(name="train")
def train_flow(cfg: LifecycleConfig, home: Home, snapshot_ref: str | None = None) -> TrainSummary:
    run_id = str(flow_run.get_id())
    seconds: dict[str, float] = {}
    t = time.perf_counter()
    snap = snapshot_task(cfg, home, snapshot_ref)
    seconds["snapshot"], t = time.perf_counter() - t, time.perf_counter()
    base = base_model_task(cfg, home, snap)
    seconds["base_model"], t = time.perf_counter() - t, time.perf_counter()
    base_version = register_base_task(cfg, home, base, run_id)
    result = finetune_task(cfg, home, snap, base)
    seconds["finetune"], t = time.perf_counter() - t, time.perf_counter()
    version = register_task(cfg, home, snap, base, base_version, result, run_id)
    seconds["register"] = time.perf_counter() - t
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
    )
    create_markdown_artifact(key="train-summary", markdown=_markdown(summary), description="Fine-tune result")
    return summary


@dataclass
class GateSummary:
    flow_run_id: str
    model: str
    version: str
    passed: bool
    summary: str
    failing: list[str]
    champion: str | None
    policy: str
    eval_sets: str
    run_id: str
    metrics: dict[str, float]
    seconds_per_suite: dict[str, float]
    report_dir: str


@task(name="gate")
def gate_task(cfg: LifecycleConfig, home: Home, ref: str, force: bool = False) -> stages.GateOutcome:
    logger = get_run_logger()

    def progress(result: Any) -> None:
        values = ", ".join(f"{m.name.split('/', 1)[1]} {m.value:.3f}" for m in result.metrics[:4])
        logger.info("suite %s: %s (%.1fs)", result.name, values, result.seconds)

    outcome = stages.gate_stage(cfg, home, ref, actor=f"flow-run:{flow_run.get_id()}", force=force, on_suite=progress)
    decision = outcome.decision
    (logger.info if decision.passed else logger.warning)("gate %s: %s", outcome.version.ref, decision.summary)
    return outcome


@flow(name="evaluate")
def evaluate_flow(cfg: LifecycleConfig, home: Home, ref: str, force: bool = False) -> GateSummary:
    """Evaluate a registered version (and the champion on the same items), decide the gate, record it."""
    outcome = gate_task(cfg, home, ref, force)
    decision = outcome.decision
    create_markdown_artifact(
        key="gate-decision",
        markdown=outcome.markdown,
        description=f"Gate {'passed' if decision.passed else 'failed'}: {outcome.version.ref}",
    )
    return GateSummary(
        flow_run_id=str(flow_run.get_id()),
        model=outcome.version.name,
        version=outcome.version.version,
        passed=decision.passed,
        summary=decision.summary,
        failing=decision.failing,
        champion=decision.champion,
        policy=decision.policy,
        eval_sets=decision.eval_sets,
        run_id=outcome.run_id,
        metrics=outcome.report.summary(),
        seconds_per_suite={s.name: s.seconds for s in outcome.report.suites},
        report_dir=str(outcome.files["decision"].parent),
    )


@dataclass
class RolloutSummary:
    model: str
    version: str
    outcome: str  # promoted | rolled-back | rejected | unchanged (already champion) | unfinished
    decisions: list[dict[str, Any]]
    aliases: dict[str, str]
    traffic: dict[str, Any]
    seconds: float
    window: tuple[datetime, datetime] | None = None  # the drift check's traffic window, when one was played


@task(name="simulated-rollout")
def simulated_rollout_task(
    cfg: LifecycleConfig, home: Home, model: str, version: str, then_requests: int = 0
) -> RolloutSummary:
    """Challenger -> the controller's ticks under simulated users on a gateway started for the purpose; then
    ``then_requests`` more simulated requests on whatever serves (the drift check's window)."""
    from dataclasses import asdict

    from flows import rollout as ro

    logger = get_run_logger()
    run_cfg = cfg.model_copy(update={"rollout": cfg.run.policy})
    t0 = time.perf_counter()
    controller = ro.open_controller(run_cfg, home, actor=f"flow-run:{flow_run.get_id()}")
    unchanged = controller.reg.deployment(model).aliases.get(ro.CHAMPION) == version
    decisions: list[dict[str, Any]] = []
    if not unchanged:
        ro.promote(run_cfg, home, model, version, reason="lifecycle run: gate passed", force=False)
        decisions = [asdict(d) for d in controller.tick()]
    rolling = bool(decisions) and decisions[-1]["action"] == "start"
    traffic: dict[str, Any] = {}
    window = None
    if rolling or then_requests:
        decisions, traffic, window = ro.simulate(
            run_cfg, home, controller, decisions, logger.info, rollout=rolling, then_requests=then_requests
        )
    outcome = "unchanged" if unchanged else _outcome([d["action"] for d in decisions])
    dep = controller.reg.deployment(model)
    (logger.info if outcome in ("promoted", "unchanged") else logger.warning)(
        "rollout of %s/%s: %s", model, version, outcome
    )
    return RolloutSummary(
        model, version, outcome, decisions, dep.aliases, traffic, time.perf_counter() - t0, window=window
    )


@task(name="drift-check")
def drift_check_task(cfg: LifecycleConfig, home: Home, start: datetime, end: datetime) -> dict[str, Any]:
    """The drift report of the run's traffic window and the retrain decision (recorded either way)."""
    from flows.monitor import publish_drift, retrain_check_stage

    logger = get_run_logger()
    check = retrain_check_stage(cfg, home, actor=f"flow-run:{flow_run.get_id()}", start=start, end=end)
    logger.info("drift %s: %s", check.monitor.report.status, check.monitor.report.reason)
    (logger.warning if check.decision.retrain else logger.info)("%s", check.decision.summary)
    publish_drift(check.monitor)
    return check.to_json()


@dataclass
class RetrainSummary:
    snapshot: str
    train: TrainSummary
    gate: GateSummary
    rollout: RolloutSummary | None


@flow(name="retrain")
def retrain_flow(cfg: LifecycleConfig, home: Home, reasons: list[str]) -> RetrainSummary:
    """A triggered retrain: a snapshot with the curated conversations -> train -> gate -> (simulated) rollout, the
    same path as any version; a version that fails its gate stops there."""
    from flows.monitor import retrain_snapshot, tag_retrained

    snap = retrain_snapshot(cfg, home)
    get_run_logger().info("retrain on snapshot %s (%s)", snap.short, "; ".join(reasons))
    trained = train_flow(cfg, home, snapshot_ref=snap.hash)
    tag_retrained(cfg, home, trained.version, reasons)
    gated = evaluate_flow(cfg, home, f"{trained.model}/{trained.version}")
    rolled = None
    if gated.passed and cfg.run.rollout:
        rolled = simulated_rollout_task(cfg, home, trained.model, trained.version)
    return RetrainSummary(snap.hash, trained, gated, rolled)


def _outcome(actions: list[str]) -> str:
    if "rollback" in actions:
        return "rolled-back"
    if "reject" in actions:
        return "rejected"
    if "promote" in actions:
        return "promoted"
    return "unfinished"


@dataclass
class RunSummary:
    train: TrainSummary
    gate: GateSummary
    rollout: RolloutSummary | None = None
    drift: dict[str, Any] | None = None  # the drift report and the retrain decision on the run's traffic
    retrain: RetrainSummary | None = None
    seconds: float = 0.0


@flow(name="lifecycle-run")
def lifecycle_run(cfg: LifecycleConfig, home: Home) -> RunSummary:
    """The loop: train, evaluate and gate the fresh version, roll it out under simulated traffic, check that
    traffic for drift, and retrain (train -> gate -> rollout again) when the decision says so."""
    t0 = time.perf_counter()
    trained = train_flow(cfg, home)
    gated = evaluate_flow(cfg, home, f"{trained.model}/{trained.version}")
    rolled = drift = retrained = None
    if gated.passed and cfg.run.rollout:
        then = cfg.run.drift_requests if cfg.run.drift_check else 0
        rolled = simulated_rollout_task(cfg, home, trained.model, trained.version, then_requests=then)
        create_markdown_artifact(key="rollout-summary", markdown=_rollout_markdown(rolled), description="Rollout")
        if rolled.window is not None:
            drift = drift_check_task(cfg, home, *rolled.window)
            if drift["retrain"] and cfg.run.retrain:
                retrained = retrain_flow(cfg, home, drift["reasons"])
    return RunSummary(trained, gated, rolled, drift, retrained, time.perf_counter() - t0)


@flow(name="champion-eval")
def champion_eval_flow(cfg: LifecycleConfig, home: Home, force: bool = True) -> dict[str, Any]:
    """Scheduled daily: the champion through the eval suites again, judged by the gate policy's floors; a
    regression is tagged on the version and reported (see ``stages.champion_eval_stage``), not acted on."""
    logger = get_run_logger()
    check = stages.champion_eval_stage(cfg, home, actor=f"flow-run:{flow_run.get_id()}", force=force)
    (logger.info if check.status == "ok" else logger.warning)(
        "champion %s: %s (%s)", check.version.ref, check.status, check.decision.summary
    )
    create_markdown_artifact(
        key="champion-eval", markdown=check.markdown, description=f"Champion {check.version.ref}: {check.status}"
    )
    return {"model": check.version.ref, "status": check.status, "failing": check.decision.failing}


def _rollout_markdown(r: RolloutSummary) -> str:
    rows = "\n".join(f"| {d['at']} | {d['action']} | {d['weight']}% | {d['reason']} |" for d in r.decisions)
    return (
        f"# Rollout of {r.model}/{r.version}: {r.outcome}\n\n| at | action | weight | reason |\n|---|---|---|---|\n"
        f"{rows}\n"
    )


def _markdown(s: TrainSummary) -> str:
    rows = "\n".join(f"| {k} | `{v}` |" for k, v in s.lineage.items())
    return (
        f"# {s.model}/{s.version}\n\nval loss {s.metrics['val_loss_initial']:.3f} → {s.metrics['val_loss']:.3f}, "
        f"{s.metrics['tokens_per_s']:.0f} tokens/s\n\n| lineage | value |\n|---|---|\n{rows}\n"
    )


def flow_run_start(name: str, since: float) -> float | None:
    """When (epoch s) the first run of flow ``name`` after ``since`` started, by Prefect's record: the time before
    it is the API's start (``benchmarks/run_loop.py``)."""
    from datetime import UTC

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowFilter, FlowFilterName, FlowRunFilter, FlowRunFilterStartTime

    after = datetime.fromtimestamp(since, UTC)
    with get_client(sync_client=True) as client:
        runs = client.read_flow_runs(
            flow_filter=FlowFilter(name=FlowFilterName(any_=[name])),
            flow_run_filter=FlowRunFilter(start_time=FlowRunFilterStartTime(after_=after)),
            limit=50,
        )
    starts = [r.start_time.timestamp() for r in runs if r.start_time is not None]
    return min(starts) if starts else None


def task_run_seconds(since: float) -> list[tuple[str, float]]:
    """(name, seconds) of the task runs that started after ``since`` (epoch s), by Prefect's own record
    (``total_run_time``: the task bodies); subflow placeholders are left out (their tasks are counted).
    ``benchmarks/run_loop.py`` uses it for the orchestration overhead."""
    from datetime import UTC

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import TaskRunFilter, TaskRunFilterStartTime

    after = datetime.fromtimestamp(since, UTC)
    with get_client(sync_client=True) as client:
        runs = client.read_task_runs(
            task_run_filter=TaskRunFilter(start_time=TaskRunFilterStartTime(after_=after)), limit=200
        )
        flows = client.read_flow_runs(limit=200)
    parents = {f.parent_task_run_id for f in flows if f.parent_task_run_id is not None}
    return [(r.name, r.total_run_time.total_seconds()) for r in runs if r.id not in parents]
