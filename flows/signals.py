"""The loop's signals (no Prefect here): the drift report of the request log and the retrain decision.

    monitor_stage(cfg, home)                          # the last monitoring.drift.window_hours vs the champion's data
    retrain_check_stage(cfg, home, actor="cli:me")    # monitor, curate, decide, record the decision

The reference is the champion's training data: the user prompts of the snapshot its lineage names. The current
window is the request log's prompts (redacted as logged) of every version. The drift report
(``monitoring.drift.detect_drift``) is written under ``reports/drift/<time>/`` (``drift.html``, light, no t-SNE;
``drift.json``) and logged as an MLflow run (``lifecycle.kind=monitor``: the numbers as metrics, both files as
artifacts); the flows publish it as Prefect artifacts too (``flows.monitor``).

The retrain decision (``monitoring.retrain.decide_retrain``: drift **and** a quality signal, cooldown, loop guard)
reads its history from the decision log (``monitoring.retrain_log``, ``logs/retrain-decisions.jsonl``: the last
trigger) and the registry (the champion, when it was promoted, whether it came out of a drift retrain: tag
``retrain.trigger``). The quality signals are the window's safety-hit and refusal rates against the champion's own
traffic before the window (from its promotion on), and the curated conversations not yet trained on
(``flows.curation``: opted-in keys, scrubbed, safe, deduplicated; kept by ``training.data.curated``). Every decision,
either way, goes to the decision log, the monitor run's tags and the registered model's tags
(``retrain.last_decision``). What a triggered retrain does is the retrain flow's (``flows.retrain``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from core.embedding import Embedder, MiniLmEmbedder
from core.errors import NotFoundError
from core.home import Home
from flows.config import LifecycleConfig
from flows.curation import export_curated, snapshot_with_curated
from flows.stages import CHAMPION, open_registry, open_serving_store
from flows.summaries import MonitorResult
from monitoring.alerts import drift_alert, post_alert
from monitoring.drift import detect_drift
from monitoring.drift_html import render_html
from monitoring.retrain import ChampionState, RetrainDecision, RetrainRecord, Signals, decide_retrain
from monitoring.retrain_log import RetrainLog
from monitoring.window import WindowRates, window_prompts, window_rates, window_span
from registry.store import ModelVersion
from serving.state.schema import RequestLogEntry
from training.data.curated import CuratedStore
from training.data.snapshot import Snapshot, load_snapshot

RETRAIN_TAG = "retrain.trigger"  # on a version trained because of a retrain decision: "drift"


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
    Opening turns on both sides (``monitoring.window.window_prompts``): follow-ups ("Now add 7 to that.") are a
    different kind of text, and their share differs between data and traffic without anything having drifted."""
    snap = load_snapshot(home.snapshots, snapshot_ref)
    return [
        next(m["content"] for m in r["messages"] if m.get("role") == "user")
        for r in snap.records("train")
        if any(m.get("role") == "user" for m in r["messages"])
    ]


def read_log(cfg: LifecycleConfig, home: Home, start: datetime, end: datetime) -> list[RequestLogEntry]:
    """Request-log rows of ``[start, end)``, oldest first."""
    with open_serving_store(cfg, home) as store:
        return [r for r in store.request_log(since=start) if r.at < end]


def _promoted_at(mv: ModelVersion) -> datetime | None:
    at = mv.tags.get(f"alias.{CHAMPION}.at")
    return datetime.fromisoformat(at) if at else None


def _baseline_rates(rows: list[RequestLogEntry], champion: str) -> WindowRates | None:
    mine = [r for r in rows if r.model_version == champion]
    return window_rates(mine) if mine else None


def monitor_stage(
    cfg: LifecycleConfig,
    home: Home,
    *,
    start: datetime | None = None,
    end: datetime | None = None,
    embedder: Embedder | None = None,
) -> MonitorResult:
    """The drift report of ``[start, end)`` (default: the last ``monitoring.drift.window_hours``) against the
    champion's training prompts, written to ``reports/drift/`` and logged to MLflow."""
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
    if report.drifted:
        _post_drift_alert(cfg, champ.ref, report.reason)
    return MonitorResult(report, champ.ref, snapshot, folder, run_id)


def _post_drift_alert(cfg: LifecycleConfig, ref: str, reason: str) -> None:
    """DriftDetected to Alertmanager (``monitoring.watch.alertmanager_url``), on to the champion watch, which records
    it on the champion; the drift report and its run stand whether or not Alertmanager takes it."""
    url = cfg.monitoring.watch.alertmanager_url
    if url:
        post_alert(url, drift_alert(ref, reason))


# --- the retrain decision ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class History:
    """``monitoring.retrain.RetrainHistory`` from the decision log and the registry."""

    last_trigger: RetrainRecord | None
    champion: ChampionState | None


def read_history(cfg: LifecycleConfig, home: Home, served_since: int | None = None) -> History:
    last = RetrainLog(home.decision_log("retrain")).last_trigger()
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


@dataclass(frozen=True)
class RetrainCheck:
    monitor: MonitorResult
    decision: RetrainDecision
    curated: dict[str, Any]  # the curation export's report
    curation_summary: str = ""  # its one line of counts (conversations and preference pairs)
    preferences: dict[str, Any] = field(default_factory=dict)  # the preference pairs from feedback

    def to_json(self) -> dict[str, Any]:
        return {
            "retrain": self.decision.retrain,
            "summary": self.decision.summary,
            "reasons": self.decision.reasons,
            "why_not": self.decision.why_not,
            "drift": self.monitor.to_json(),
            "curated": self.curated,
            "curation_summary": self.curation_summary,
            "preferences": self.preferences,
        }


def retrain_check_stage(
    cfg: LifecycleConfig,
    home: Home,
    *,
    actor: str,
    start: datetime | None = None,
    end: datetime | None = None,
    embedder: Embedder | None = None,
) -> RetrainCheck:
    """Monitor, curate the new opted-in conversations, decide, record the decision (every outcome)."""
    monitor = monitor_stage(cfg, home, start=start, end=end, embedder=embedder)
    reference = load_snapshot(home.snapshots, monitor.snapshot)
    curation = export_curated(cfg, home, snapshot=reference)
    signals = Signals.from_report(monitor.report, new_curated=CuratedStore(home.curated).untrained(reference))
    now = datetime.now(UTC)
    decision = decide_retrain(monitor.report, signals, read_history(cfg, home), cfg.monitoring.retrain, now)
    record_decision(cfg, home, decision, monitor, actor)
    return RetrainCheck(
        monitor, decision, curation.report.to_json(), curation.summary(), curation.to_json()["preferences"]
    )


def record_decision(
    cfg: LifecycleConfig, home: Home, decision: RetrainDecision, monitor: MonitorResult, actor: str
) -> None:
    """The decision and its evidence: decision log, the monitor run's tags, the registered model's tags."""
    RetrainLog(home.decision_log("retrain")).append(decision, by=actor, run_id=monitor.run_id)
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


def retrain_snapshot(cfg: LifecycleConfig, home: Home) -> Snapshot:
    """The snapshot a triggered retrain trains on: the configured data plus every curated file."""
    return snapshot_with_curated(cfg, home, CuratedStore(home.curated).sources())


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
