"""Monitoring and the retrain loop: ``lifecycle monitor`` (a drift report on the request log), ``lifecycle retrain``
(the decision, and the retrain it triggers), their Prefect flows (scheduled by ``lifecycle schedule``), and the
drift stage of ``lifecycle run``.

    lifecycle monitor                  # the last monitoring.drift.window_hours of traffic vs the champion's data
    lifecycle retrain                  # monitor, curate, decide; retrain -> gate -> rollout when triggered
    lifecycle retrain --dry-run        # the decision only

The reference is the champion's training data: the user prompts of the snapshot its lineage names. The current
window is the request log's prompts (redacted as logged) of every version. The drift report
(``monitoring.drift.detect_drift``) is written under ``reports/drift/<time>/`` (``drift.html``, light, no t-SNE;
``drift.json``) and logged as an MLflow run (``lifecycle.kind=monitor``: the numbers as metrics, both files as
artifacts); the flows publish it as Prefect artifacts too.

The retrain decision (``monitoring.retrain.decide_retrain``: drift **and** a quality signal, cooldown, loop guard)
reads its history from the decision log (``logs/retrain-decisions.jsonl``: the last trigger) and the registry (the
champion, when it was promoted, whether it came out of a drift retrain: tag ``retrain.trigger``). The quality
signals are the window's safety-hit and refusal rates against the champion's own traffic before the window (from
its promotion on), and the curated conversations not yet trained on (``flows.curation``: opted-in keys, scrubbed,
safe, deduplicated). Every decision, either way, goes to the decision log, the monitor run's tags and the
registered model's tags (``retrain.last_decision``). A triggered retrain builds a snapshot with the curated
conversations and takes the same path as any version: train -> evaluate and gate -> rollout; a version that fails
its gate stops there.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prefect import flow, get_run_logger
from prefect.artifacts import create_markdown_artifact
from prefect.runtime import flow_run

from core.errors import NotFoundError
from core.home import Home
from flows.config import LifecycleConfig
from flows.stages import CHAMPION, open_registry

if TYPE_CHECKING:
    from monitoring.drift import DriftReport, WindowRates
    from monitoring.retrain import ChampionState, RetrainDecision, RetrainRecord
    from registry.store import ModelVersion
    from serving.schema import RequestLogEntry

RETRAIN_TAG = "retrain.trigger"  # on a version trained because of a retrain decision: "drift"


@dataclass(frozen=True)
class MonitorResult:
    report: DriftReport
    champion: str  # e.g. chat/3
    snapshot: str  # the reference: the champion's training snapshot
    folder: Path  # reports/drift/<time>/ with drift.html and drift.json
    run_id: str

    def to_json(self) -> dict[str, Any]:
        r = self.report
        return {
            "status": r.status,
            "drifted": r.drifted,
            "reason": r.reason,
            "champion": self.champion,
            "snapshot": self.snapshot,
            "reference_n": r.reference_n,
            "current_n": r.current_n,
            "metrics": r.metrics(),
            "seconds": r.seconds.total_s,
            "html": str(self.folder / "drift.html"),
            "run_id": self.run_id,
        }


def champion_version(cfg: LifecycleConfig, home: Home) -> ModelVersion:
    try:
        return open_registry(cfg, home).by_alias(cfg.registry.model_name, CHAMPION)
    except NotFoundError:
        raise NotFoundError(
            f"no champion of {cfg.registry.model_name!r} yet: monitoring compares traffic with the champion's "
            "training data (lifecycle run, or lifecycle promote, makes one)"
        ) from None


def reference_prompts(home: Home, snapshot_ref: str) -> list[str]:
    """The opening user turn of each record of the snapshot's train split: what the model was trained to be asked.
    Opening turns on both sides (``monitoring.drift.window_prompts``): follow-ups ("Now add 7 to that.") are a
    different kind of text, and their share differs between data and traffic without anything having drifted."""
    from training.snapshot import load_snapshot

    snap = load_snapshot(home.snapshots, snapshot_ref)
    return [
        next(m["content"] for m in r["messages"] if m.get("role") == "user")
        for r in snap.records("train")
        if any(m.get("role") == "user" for m in r["messages"])
    ]


def _store(cfg: LifecycleConfig, home: Home) -> Any:
    from flows.cli import serve_spec
    from serving.runtime import database_url
    from serving.store import ServingStore

    return ServingStore(database_url(serve_spec(cfg, home)))


def read_log(cfg: LifecycleConfig, home: Home, start: datetime, end: datetime) -> list[RequestLogEntry]:
    """Request-log rows of ``[start, end)``, oldest first."""
    with _store(cfg, home) as store:
        return [r for r in store.request_log(since=start) if r.at < end]


def _promoted_at(mv: ModelVersion) -> datetime | None:
    at = mv.tags.get(f"alias.{CHAMPION}.at")
    return datetime.fromisoformat(at) if at else None


def _baseline_rates(rows: list[RequestLogEntry], champion: str) -> WindowRates | None:
    from monitoring.drift import window_rates

    mine = [r for r in rows if r.model_version == champion]
    return window_rates(mine) if mine else None


def monitor_stage(
    cfg: LifecycleConfig,
    home: Home,
    *,
    start: datetime | None = None,
    end: datetime | None = None,
    embedder: Any = None,
) -> MonitorResult:
    """The drift report of ``[start, end)`` (default: the last ``monitoring.drift.window_hours``) against the
    champion's training prompts, written to ``reports/drift/`` and logged to MLflow."""
    from core.embedding import MiniLmEmbedder
    from monitoring.drift import detect_drift, window_prompts, window_rates, window_span
    from monitoring.drift_html import render_html

    m = cfg.monitoring
    end = end or datetime.now(UTC)
    start = start or end - timedelta(hours=m.drift.window_hours)
    champ = champion_version(cfg, home)
    snapshot = champ.lineage.get("snapshot")
    if not snapshot:
        raise NotFoundError(f"{champ.ref} has no lineage.snapshot tag: no reference data to compare with")
    rows = read_log(cfg, home, start, end)
    promoted = _promoted_at(champ) or start
    before = read_log(cfg, home, min(promoted, start), start) if promoted < start else []
    if embedder is None and m.embeddings:
        embedder = MiniLmEmbedder(threads=1)  # one thread: 2-6x less CPU for the same throughput on 2 cores
    report = detect_drift(
        reference_prompts(home, snapshot),
        window_prompts(rows),
        m.drift,
        embedder,
        current_rates=window_rates(rows),
        reference_rates=_baseline_rates(before, champ.ref),
        window=window_span(rows, start, end),
    )
    folder = home.reports / "drift" / end.strftime("%Y%m%dT%H%M%S")
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "drift.html").write_text(render_html(report), encoding="utf-8")
    (folder / "drift.json").write_text(json.dumps(report.to_dict(), indent=2) + "\n", encoding="utf-8")
    run_id = open_registry(cfg, home).log_run(
        run_name=f"monitor {champ.ref}",
        params={"champion": champ.ref, "snapshot": snapshot, "start": start.isoformat(), "end": end.isoformat()},
        metrics=[{"step": 0, **report.metrics()}],
        artifacts={"drift": folder},
        tags={"lifecycle.kind": "monitor", "drift.status": report.status, "drift.reason": report.reason[:4000]},
    )
    return MonitorResult(report, champ.ref, snapshot, folder, run_id)


# --- the retrain decision ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class History:
    """``monitoring.retrain.RetrainHistory`` from the decision log and the registry."""

    last_trigger: RetrainRecord | None
    champion: ChampionState | None


def read_history(cfg: LifecycleConfig, home: Home, served_since: int | None = None) -> History:
    from monitoring.retrain import ChampionState, RetrainDecision

    last = None
    path = home.decision_log("retrain")
    if path.is_file():
        for line in path.read_text(encoding="utf-8").splitlines():
            decision = RetrainDecision.from_dict(json.loads(line)["decision"])
            last = decision.record() or last
    try:
        champ = champion_version(cfg, home)
    except NotFoundError:
        return History(last, None)
    promoted = _promoted_at(champ)
    if served_since is None:
        since = promoted or datetime(1970, 1, 1, tzinfo=UTC)
        served_since = sum(1 for r in read_log(cfg, home, since, datetime.now(UTC)) if r.model_version == champ.ref)
    state = ChampionState(champ.ref, promoted, served_since, champ.tags.get(RETRAIN_TAG) == "drift")
    return History(last, state)


def untrained_curated(home: Home, snapshot_ref: str) -> int:
    """Curated records on disk that the snapshot (the champion's data) does not hold yet."""
    from core.hashing import sha256_file
    from flows.curation import curated_sources
    from training.snapshot import load_snapshot

    trained = {s["sha256"] for s in load_snapshot(home.snapshots, snapshot_ref).manifest.get("sources", [])}
    files = [p for p in curated_sources(home) if sha256_file(p) not in trained]
    return sum(1 for p in files for line in p.read_text(encoding="utf-8").splitlines() if line.strip())


@dataclass(frozen=True)
class RetrainCheck:
    monitor: MonitorResult
    decision: RetrainDecision
    curated: dict[str, Any]  # the curation export's report

    def to_json(self) -> dict[str, Any]:
        return {
            "retrain": self.decision.retrain,
            "summary": self.decision.summary,
            "reasons": self.decision.reasons,
            "why_not": self.decision.why_not,
            "drift": self.monitor.to_json(),
            "curated": self.curated,
        }


def retrain_check_stage(
    cfg: LifecycleConfig,
    home: Home,
    *,
    actor: str,
    start: datetime | None = None,
    end: datetime | None = None,
    embedder: Any = None,
) -> RetrainCheck:
    """Monitor, curate the new opted-in conversations, decide, record the decision (every outcome)."""
    from flows.curation import export_curated
    from monitoring.retrain import Signals, decide_retrain
    from training.snapshot import load_snapshot

    monitor = monitor_stage(cfg, home, start=start, end=end, embedder=embedder)
    curation = export_curated(cfg, home, snapshot=load_snapshot(home.snapshots, monitor.snapshot))
    signals = Signals.from_report(monitor.report, new_curated=untrained_curated(home, monitor.snapshot))
    now = datetime.now(UTC)
    decision = decide_retrain(monitor.report, signals, read_history(cfg, home), cfg.monitoring.retrain, now)
    record_decision(cfg, home, decision, monitor, actor)
    return RetrainCheck(monitor, decision, curation.report.to_json())


def record_decision(
    cfg: LifecycleConfig, home: Home, decision: RetrainDecision, monitor: MonitorResult, actor: str
) -> None:
    """The decision and its evidence: decision log, the monitor run's tags, the registered model's tags."""
    entry = {"at": decision.at.isoformat(), "by": actor, "run_id": monitor.run_id, "decision": decision.to_dict()}
    path = home.decision_log("retrain")
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as f:
        f.write(json.dumps(entry, default=str) + "\n")
    reg = open_registry(cfg, home)
    verdict = "retrain" if decision.retrain else "no-retrain"
    reg.set_run_tags(monitor.run_id, {"retrain.decision": verdict, "retrain.summary": decision.summary[:4900]})
    reg.set_model_tags(
        cfg.registry.model_name,
        {
            "retrain.last_decision": verdict,
            "retrain.last_decision_at": decision.at.isoformat(timespec="seconds"),
            "retrain.last_summary": decision.summary[:4900],
        },
    )


def retrain_snapshot(cfg: LifecycleConfig, home: Home) -> Any:
    """The snapshot a triggered retrain trains on: the configured data plus every curated file."""
    from flows.curation import curated_sources, snapshot_with_curated

    return snapshot_with_curated(cfg, home, curated_sources(home))


def tag_retrained(cfg: LifecycleConfig, home: Home, version: str, reasons: list[str]) -> None:
    """Mark a version trained because of a retrain decision (the loop guard reads it once it is champion)."""
    open_registry(cfg, home).set_tags(
        cfg.registry.model_name,
        version,
        {
            RETRAIN_TAG: "drift",
            "retrain.at": datetime.now(UTC).isoformat(timespec="seconds"),
            "retrain.reasons": "; ".join(reasons)[:4900],
        },
    )


# --- Prefect flows (scheduled by lifecycle schedule) ------------------------------------------------------------


def drift_markdown(check: MonitorResult) -> str:
    r = check.report
    lines = [
        f"# Drift: {r.status}",
        "",
        f"{r.reason}",
        "",
        f"champion {check.champion}, reference snapshot `{check.snapshot[:12]}`: {r.reference_n} prompts; "
        f"window: {r.current_n} prompts; {r.seconds.total_s:.1f} s",
        "",
        "| metric | value |",
        "|---|---|",
    ]
    lines += [f"| {k} | {v:.4g} |" for k, v in sorted(r.metrics().items())]
    return "\n".join(lines) + f"\n\nHTML report: `{check.folder / 'drift.html'}` (MLflow run `{check.run_id}`)\n"


def publish_drift(result: MonitorResult) -> None:
    create_markdown_artifact(
        key="drift-report", markdown=drift_markdown(result), description=result.report.reason[:200]
    )


def _actor() -> str:
    return f"flow-run:{flow_run.get_id()}"


@flow(name="monitor")
def monitor_flow(cfg: LifecycleConfig, home: Home) -> dict[str, Any]:
    """Scheduled every 15 minutes: the drift report of the last window (Markdown artifact ``drift-report``)."""
    result = monitor_stage(cfg, home)
    get_run_logger().info("drift %s: %s", result.report.status, result.report.reason)
    publish_drift(result)
    return result.to_json()


@flow(name="retrain-check")
def retrain_check_flow(cfg: LifecycleConfig, home: Home, dry_run: bool = False) -> dict[str, Any]:
    """Monitor, curate, decide; a triggered retrain trains on the curated snapshot, gates the version and, when it
    passes, makes it the challenger (the rollout controller takes it from there, on real users)."""
    from flows import rollout as ro
    from flows.pipeline import evaluate_flow, train_flow

    logger = get_run_logger()
    check = retrain_check_stage(cfg, home, actor=_actor())
    publish_drift(check.monitor)
    logger.info("%s", check.decision.summary)
    out = check.to_json()
    if not check.decision.retrain or dry_run:
        return out
    snap = retrain_snapshot(cfg, home)
    trained = train_flow(cfg, home, snapshot_ref=snap.hash)
    tag_retrained(cfg, home, trained.version, check.decision.reasons)
    gated = evaluate_flow(cfg, home, f"{trained.model}/{trained.version}")
    out["retrained"] = {"version": trained.version, "snapshot": snap.hash, "gate": gated.summary}
    if gated.passed:
        ro.promote(cfg, home, trained.model, trained.version, reason="drift retrain: gate passed", force=False)
        out["retrained"]["challenger"] = True
    else:
        logger.warning("the retrained version %s/%s failed its gate: %s", trained.model, trained.version, gated.summary)
    return out
