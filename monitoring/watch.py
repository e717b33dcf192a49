"""The champion watch: what an alert about the serving fleet does.

Prometheus evaluates infra/prometheus/alerts.yml over the gateways' metrics and sends firing (and resolved) alerts
to Alertmanager, whose webhook posts them to ``lifecycle watch`` (flows/watch.py), which calls ``ChampionWatch``:

1. ``parse_webhook(body)`` reads Alertmanager's webhook payload (version 4) into ``Alert`` values;
2. ``judge(alert, champion, promoted_at, policy, now)`` decides, purely: **rollback** when a firing alert of a
   rollback severity and signal (``monitoring.watch``: critical, slo or safety) is about the champion and came
   within ``rollback_window_s`` of its promotion, else **record** (for a person);
3. ``ChampionWatch.handle`` acts: every alert is tagged on the champion's MLflow version (``watch.alert.<name>``,
   ``watch.last_alert``) and written to the rollout run log (``decisions.jsonl``, action ``alert``); a rollback
   goes through the canary's own path (``RolloutController.rollback(..., watch=True)``: champion back to
   previous-champion, the version quarantined with the reason).

An alert about another version (a canary's, which the controller handles) or none (engine down) is recorded only.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

from core.errors import RolloutError
from monitoring.config import WatchConfig
from monitoring.controller import CHAMPION, PREVIOUS, Decision, RolloutController

Action = Literal["rollback", "record"]


@dataclass(frozen=True)
class Alert:
    name: str
    status: str  # firing | resolved
    severity: str
    signal: str
    model_version: str | None  # NAME/VERSION, as the gateway labels its metrics
    summary: str
    starts_at: datetime

    def line(self) -> str:
        about = self.model_version or "the fleet"
        return f"{self.name} ({self.severity}, {self.signal}) {self.status} on {about}: {self.summary}"


@dataclass(frozen=True)
class Judgement:
    action: Action
    reason: str


def parse_webhook(body: Mapping[str, Any]) -> list[Alert]:
    """Alertmanager's webhook payload -> alerts; ValueError on anything else."""
    if not isinstance(body.get("alerts"), list):
        raise ValueError("not an Alertmanager webhook payload: no 'alerts' list")
    out = []
    for raw in body["alerts"]:
        labels = raw.get("labels") or {}
        if "alertname" not in labels:
            raise ValueError("an alert without an alertname label")
        started = str(raw.get("startsAt") or datetime.now(UTC).isoformat())
        out.append(
            Alert(
                name=str(labels["alertname"]),
                status=str(raw.get("status", "firing")),
                severity=str(labels.get("severity", "warning")),
                signal=str(labels.get("signal", "-")),
                model_version=labels.get("model_version"),
                summary=str((raw.get("annotations") or {}).get("summary", "")),
                starts_at=_parse_time(started),
            )
        )
    return out


def judge(
    alert: Alert, champion: str | None, promoted_at: datetime | None, policy: WatchConfig, now: datetime
) -> Judgement:
    """Rollback or record, and why. ``champion`` is NAME/VERSION; ``promoted_at`` when it got the alias."""
    if alert.status != "firing":
        return Judgement("record", f"{alert.name} resolved")
    if champion is None or alert.model_version != champion:
        return Judgement("record", f"{alert.name} is not about the champion ({champion or 'none'}): for a person")
    severe = alert.severity in policy.rollback_severities and alert.signal in policy.rollback_signals
    if not severe:
        return Judgement("record", f"{alert.name} ({alert.severity}, {alert.signal}) does not roll back: for a person")
    if promoted_at is None:
        return Judgement("record", f"{alert.name} on {champion}, whose promotion time is unknown: for a person")
    age = now - promoted_at
    if age > timedelta(seconds=policy.rollback_window_s):
        return Judgement(
            "record",
            f"{alert.name} on {champion} {age.total_seconds():.0f} s after its promotion, past the "
            f"{policy.rollback_window_s:.0f} s window: for a person",
        )
    return Judgement(
        "rollback",
        f"{alert.name} ({alert.severity} {alert.signal} breach) {age.total_seconds():.0f} s after promotion: "
        f"{alert.summary}",
    )


class ChampionWatch:
    """Acts on alerts for one registered model, through the rollout controller (its registry, run log, rollback)."""

    def __init__(self, controller: RolloutController, policy: WatchConfig) -> None:
        self.controller = controller
        self.policy = policy

    def handle(self, alerts: Iterable[Alert], now: datetime | None = None) -> list[Decision]:
        out = []
        for alert in alerts:
            out.append(self._one(alert, now or datetime.now(UTC)))
        return out

    def _one(self, alert: Alert, now: datetime) -> Decision:
        c = self.controller
        dep = c.reg.deployment(c.name)
        version = dep.aliases.get(CHAMPION)
        mv = c.reg.get(c.name, version) if version else None
        promoted = mv.tags.get(f"alias.{CHAMPION}.at") if mv else None
        verdict = judge(alert, mv.ref if mv else None, _parse_time(promoted) if promoted else None, self.policy, now)
        if mv is not None:
            record = {"status": alert.status, "severity": alert.severity, "signal": alert.signal, "at": _iso(now)}
            record |= {"about": alert.model_version or "-", "summary": alert.summary, "action": verdict.action}
            c.reg.set_tags(
                c.name,
                mv.version,
                {
                    f"watch.alert.{alert.name}": json.dumps(record, sort_keys=True)[:4900],
                    "watch.last_alert": f"{_iso(now)} {alert.line()} -> {verdict.action}: {verdict.reason}"[:4900],
                },
            )
        note = Decision(
            at=_iso(now),
            model=c.name,
            version=version or "-",
            action="alert",
            phase=None,
            weight=0,
            reason=f"{alert.line()} -> {verdict.action}: {verdict.reason}",
        )
        c.record(note)
        if verdict.action != "rollback" or mv is None:
            return note
        if dep.aliases.get(PREVIOUS) in (None, mv.version):
            blocked = f"{verdict.reason}; no previous-champion to roll back to: for a person"
            return self._recorded(note, blocked)
        try:
            decision = c.rollback(mv, f"champion watch: {verdict.reason}", now, watch=True, dep=dep)
        except RolloutError as exc:
            return self._recorded(note, f"{verdict.reason}; rollback failed: {exc}")
        c.record(decision)
        return decision

    def _recorded(self, note: Decision, reason: str) -> Decision:
        blocked = Decision(**{**note.__dict__, "reason": reason})
        self.controller.record(blocked)
        return blocked


def _parse_time(text: str) -> datetime:
    at = datetime.fromisoformat(text.replace("Z", "+00:00"))
    return at if at.tzinfo else at.replace(tzinfo=UTC)


def _iso(at: datetime) -> str:
    return at.astimezone(UTC).isoformat(timespec="seconds")
