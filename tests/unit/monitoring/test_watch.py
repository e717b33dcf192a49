"""The champion watch: ``judge`` as a table, then ``ChampionWatch`` acting on the in-memory registry of the
controller's tests (tags on the champion, the run log, the rollback through the controller's own path)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from unit.monitoring.test_controller import NAME, POLICY, FakeDeployments, FakeLog

from monitoring.config import WatchConfig
from monitoring.controller import RolloutController, read_decisions
from monitoring.watch import Alert, ChampionWatch, judge, parse_webhook

T0 = datetime(2026, 11, 27, 12, 0, tzinfo=UTC)
WATCH = WatchConfig(rollback_window_s=600)


def alert(name: str = "TtftP95OverSlo", *, version: str | None = "chat/2", **labels: str) -> Alert:
    fields: dict[str, Any] = {"severity": "critical", "signal": "slo", "status": "firing"} | labels
    return Alert(name=name, model_version=version, summary="TTFT p95 2s over the 1 s SLO", starts_at=T0, **fields)


@pytest.mark.parametrize(
    ("case", "promoted_s_ago", "expected"),
    [
        (alert(), 60, "rollback"),
        (alert("SafetyFilterHitsJump", signal="safety"), 60, "rollback"),
        (alert(), 601, "record"),  # past the window: a person decides
        (alert(severity="warning"), 60, "record"),
        (alert("EngineDown", signal="availability"), 60, "record"),
        (alert(version="chat/3"), 60, "record"),  # a canary's: the controller's business
        (alert(version=None), 60, "record"),
        (alert(status="resolved"), 60, "record"),
        (alert(), None, "record"),  # promotion time unknown
    ],
)
def test_judge(case: Alert, promoted_s_ago: int | None, expected: str) -> None:
    promoted = None if promoted_s_ago is None else T0 - timedelta(seconds=promoted_s_ago)
    got = judge(case, "chat/2", promoted, WATCH, T0)
    assert got.action == expected, got.reason
    assert case.name in got.reason


def test_parse_webhook_reads_alertmanagers_payload_and_refuses_others() -> None:
    body = {
        "version": "4",
        "status": "firing",
        "alerts": [
            {
                "status": "firing",
                "labels": {"alertname": "GoodputLow", "severity": "critical", "signal": "slo"}
                | {"model_version": "chat/2"},
                "annotations": {"summary": "goodput 10%"},
                "startsAt": "2026-11-27T12:00:00.123456789Z",
            }
        ],
    }
    (a,) = parse_webhook(body)
    assert (a.name, a.model_version, a.severity, a.summary) == ("GoodputLow", "chat/2", "critical", "goodput 10%")
    assert a.starts_at == datetime(2026, 11, 27, 12, 0, 0, 123456, tzinfo=UTC)
    with pytest.raises(ValueError, match="alerts"):
        parse_webhook({"receiver": "x"})
    with pytest.raises(ValueError, match="alertname"):
        parse_webhook({"alerts": [{"labels": {}}]})


@pytest.fixture
def watched(tmp_path: Path) -> tuple[FakeDeployments, ChampionWatch, Path]:
    """chat/2 promoted over chat/1 a minute before T0."""
    reg = FakeDeployments()
    reg.add("1")
    reg.add("2", **{"alias.champion.at": (T0 - timedelta(seconds=60)).isoformat()})
    reg.aliases |= {"champion": "2", "previous-champion": "1"}
    log = tmp_path / "decisions.jsonl"
    ctl = RolloutController(reg, FakeLog(), POLICY, NAME, actor="watch", decisions_path=log)
    return reg, ChampionWatch(ctl, WATCH), log


def test_a_severe_breach_after_a_promotion_rolls_back_with_the_reason(watched: Any) -> None:
    reg, watch, log = watched
    (decision,) = watch.handle([alert()], now=T0)
    assert decision.action == "rollback" and "TtftP95OverSlo" in decision.reason
    assert reg.aliases["champion"] == "1"
    assert reg.tags["2"]["rollout.quarantined"] == "true"
    assert "TtftP95OverSlo" in reg.tags["2"]["rollout.quarantine_reason"]
    assert any(a["alias"] == "champion" and a["to"] == "1" and "watch" in a["reason"] for a in reg.audit)
    # the alert itself on the version, and both the alert and the rollback in the run log
    assert json.loads(reg.tags["2"]["watch.alert.TtftP95OverSlo"])["action"] == "rollback"
    assert [d.action for d in read_decisions(log, NAME)] == ["alert", "rollback"]
    # Alertmanager repeats it: now about a version that is no longer champion, it is only recorded on chat/1
    (again,) = watch.handle([alert()], now=T0 + timedelta(seconds=30))
    assert again.action == "alert" and reg.aliases["champion"] == "1"
    assert json.loads(reg.tags["1"]["watch.alert.TtftP95OverSlo"])["action"] == "record"


def test_a_warning_is_recorded_on_the_champion_for_a_person(watched: Any) -> None:
    reg, watch, log = watched
    (decision,) = watch.handle([alert("AbortRatioHigh", severity="warning")], now=T0)
    assert decision.action == "alert" and "for a person" in decision.reason
    assert reg.aliases["champion"] == "2"
    assert "AbortRatioHigh" in reg.tags["2"]["watch.last_alert"]
    assert read_decisions(log, NAME)[-1].reason == decision.reason


def test_without_a_previous_champion_the_breach_is_left_to_a_person(watched: Any) -> None:
    reg, watch, _ = watched
    del reg.aliases["previous-champion"]
    (decision,) = watch.handle([alert()], now=T0)
    assert decision.action == "alert" and "no previous-champion" in decision.reason
    assert reg.aliases["champion"] == "2"
