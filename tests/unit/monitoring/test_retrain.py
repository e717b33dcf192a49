"""The retrain decision, table-driven: drift alone never retrains, drift with a quality signal (safety hits or
refusals risen beyond the tolerance, or enough new curated conversations) does, unless the cooldown or the loop
guard (same traffic, a window the champion did not serve, a drift-retrained champion that has not seen new
traffic) holds it back; every decision carries JSON-able evidence, and a trigger's record blocks a repeat."""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

import pytest
from unit.monitoring.rows import CANARY, CHAMPION, T0

from monitoring.drift import DriftReport
from monitoring.drift_config import RetrainPolicy
from monitoring.retrain import (
    ChampionState,
    QualitySignals,
    RetrainDecision,
    RetrainHistory,
    RetrainRecord,
    Signals,
    decide_retrain,
)
from monitoring.window import WindowRates, WindowSpan

POLICY = RetrainPolicy()
NOW = T0 + timedelta(days=10)
WINDOW = WindowSpan(start=NOW - timedelta(hours=24), end=NOW, versions={CHAMPION: 950, CANARY: 50})
BASELINE = WindowRates(answered=1000, safety_hits=20, completed=950, refusals=95)  # 2% hits, 10% refusals
CALM = WindowRates(answered=1000, safety_hits=22, completed=950, refusals=100)
UNSAFE = WindowRates(answered=1000, safety_hits=80, completed=950, refusals=100)  # 8% hits: +6 points
REFUSING = WindowRates(answered=1000, safety_hits=20, completed=950, refusals=220)  # 23% refusals: +13 points
SETTLED = ChampionState(CHAMPION, promoted_at=T0, served_since_promotion=50_000)


@dataclass(frozen=True)
class History:
    """A ``RetrainHistory`` kept in memory."""

    last_trigger: RetrainRecord | None = None
    champion: ChampionState | None = SETTLED


def _protocols(h: History, s: Signals) -> tuple[RetrainHistory, QualitySignals]:
    return h, s  # mypy checks that the fakes satisfy the Protocols


def drift_report(status: str = "drifted", window: WindowSpan | None = WINDOW) -> DriftReport:
    return DriftReport(
        status=status,
        drifted=status == "drifted",
        reason=f"rule either; (a {status} window)",
        rule="either",
        reference_n=5000,
        current_n=1000,
        drifted_share=0.8 if status == "drifted" else 0.0,
        drift_share_threshold=0.5,
        window=window,
        config_hash="abc",
    )


def last_trigger(hours_ago: float, window_end: datetime | None = None) -> RetrainRecord:
    at = NOW - timedelta(hours=hours_ago)
    end = window_end or at
    return RetrainRecord(at=at, window_start=end - timedelta(hours=24), window_end=end, champion_version=CHAMPION)


CASES: list[Any] = [
    pytest.param({}, Signals(CALM, BASELINE), False, "no quality signal", id="drift-only-no"),
    pytest.param({}, Signals(UNSAFE, BASELINE), True, "safety_hit_rate 0.080", id="drift-and-safety-rise-yes"),
    pytest.param({}, Signals(REFUSING, BASELINE), True, "refusal_rate 0.232", id="drift-and-refusal-rise-yes"),
    pytest.param({}, Signals(CALM, BASELINE, 500), True, "500 new curated conversations >= 500", id="curated-yes"),
    pytest.param({}, Signals(CALM, BASELINE, 499), False, "499 new curated conversations < 500", id="curated-short"),
    pytest.param(
        {"status": "no_drift"}, Signals(UNSAFE, BASELINE, 900), False, "no drift", id="quality-without-drift-no"
    ),
    pytest.param(
        {"status": "inconclusive"}, Signals(UNSAFE, BASELINE), False, "drift inconclusive", id="inconclusive-no"
    ),
    pytest.param(
        {},
        Signals(WindowRates(answered=1000, safety_hits=35, completed=950, refusals=95), BASELINE),
        False,
        "not risen beyond the tolerance",
        id="rise-within-tolerance-no",
    ),
    pytest.param(
        {},
        Signals(WindowRates(answered=50, safety_hits=20, completed=50, refusals=5), BASELINE),
        False,
        "too few requests to test (window 50, baseline 1000, need 100)",
        id="too-few-requests-to-test-no",
    ),
    pytest.param({}, Signals(None, BASELINE), False, "no window rates", id="no-rates-no"),
    pytest.param(
        {"history": History(last_trigger(hours_ago=6, window_end=NOW - timedelta(hours=30)))},
        Signals(UNSAFE, BASELINE),
        False,
        "cooldown: the last retrain was triggered 6.0 h ago (< 24 h)",
        id="cooldown-no",
    ),
    pytest.param(
        {"history": History(last_trigger(hours_ago=30))},
        Signals(UNSAFE, BASELINE),
        True,
        "safety_hit_rate",
        id="after-cooldown-yes",
    ),
    pytest.param(
        {"history": History(last_trigger(hours_ago=30, window_end=NOW - timedelta(hours=2)))},
        Signals(UNSAFE, BASELINE),
        False,
        "the same traffic cannot trigger twice",
        id="loop-guard-same-traffic-no",
    ),
    pytest.param(
        {"window": WindowSpan(start=WINDOW.start, end=NOW, versions={"chat/0": 700, CHAMPION: 300})},
        Signals(UNSAFE, BASELINE),
        False,
        "the champion chat/1 served 30% of the window (300/1000) < 80%",
        id="loop-guard-window-served-by-another-version-no",
    ),
    pytest.param(
        {"history": History(champion=ChampionState(CHAMPION, NOW - timedelta(hours=12), 5000, True))},
        Signals(UNSAFE, BASELINE),
        False,
        "came out of a drift retrain and the window starts",
        id="loop-guard-window-before-the-retrained-champion-no",
    ),
    pytest.param(
        {
            "history": History(champion=ChampionState(CHAMPION, NOW - timedelta(hours=30), 120, True)),
        },
        Signals(UNSAFE, BASELINE),
        False,
        "has served 120 requests since its promotion (< 500)",
        id="loop-guard-retrained-champion-without-new-traffic-no",
    ),
    pytest.param(
        {"history": History(champion=ChampionState(CHAMPION, NOW - timedelta(hours=30), 5000, True))},
        Signals(UNSAFE, BASELINE),
        True,
        "safety_hit_rate",
        id="retrained-champion-with-new-traffic-yes",
    ),
    pytest.param({"window": None}, Signals(UNSAFE, BASELINE), False, "has no window span", id="no-window-no"),
    pytest.param(
        {"history": History(champion=None)}, Signals(UNSAFE, BASELINE), False, "no champion", id="no-champion-no"
    ),
]


@pytest.mark.parametrize(("setup", "signals", "retrain", "says"), CASES)
def test_decide_retrain(setup: dict[str, Any], signals: Signals, retrain: bool, says: str) -> None:
    report = drift_report(setup.get("status", "drifted"), setup.get("window", WINDOW))
    decision = decide_retrain(report, signals, setup.get("history", History()), POLICY, NOW)
    assert decision.retrain is retrain, decision.summary
    assert (decision.why_not == []) is retrain
    lines = decision.reasons if retrain else decision.why_not
    assert any(says in line for line in lines), lines
    if retrain:
        assert decision.reasons[0].startswith("drift: ")
    json.dumps(decision.to_dict())  # the evidence is JSON-able


def test_the_evidence_holds_the_numbers_behind_the_decision() -> None:
    decision = decide_retrain(drift_report(), Signals(UNSAFE, BASELINE, 12), History(), POLICY, NOW)
    ev = decision.evidence
    assert ev["drift"]["status"] == "drifted" and ev["drift"]["drifted_share"] == 0.8
    safety = ev["quality"]["safety_hit_rate"]
    assert safety["current"] == [80, 1000] and safety["baseline"] == [20, 1000] and safety["fired"] is True
    assert safety["diff"] == pytest.approx(0.06) and safety["p_value"] < POLICY.alpha
    assert ev["quality"]["refusal_rate"]["fired"] is False
    assert ev["quality"]["new_curated"] == {"count": 12, "minimum": 500, "fired": False}
    guard = ev["loop_guard"]
    assert guard["champion"] == CHAMPION and guard["champion_share"] == pytest.approx(0.95)
    assert guard["window_end"] == NOW.isoformat() and ev["policy_hash"] == POLICY.config_hash()
    assert ev["cooldown"] == {"hours": 24.0, "last_trigger_at": None}
    again = RetrainDecision.from_dict(json.loads(json.dumps(decision.to_dict())))
    assert again == decision


def test_a_trigger_never_triggers_itself() -> None:
    """The same report an hour later, with the record of the first trigger in the history: blocked twice over
    (cooldown, same traffic); a fresh window after the cooldown, from a retrained champion that has served
    enough since its promotion, may trigger again."""
    signals = Signals(UNSAFE, BASELINE)
    first = decide_retrain(drift_report(), signals, History(), POLICY, NOW)
    record = first.record()
    assert first.retrain and record is not None
    assert (record.window_start, record.window_end, record.champion_version) == (WINDOW.start, NOW, CHAMPION)

    later = NOW + timedelta(hours=1)
    repeat = decide_retrain(drift_report(), signals, History(last_trigger=record), POLICY, later)
    assert not repeat.retrain and repeat.record() is None
    assert any(w.startswith("cooldown") for w in repeat.why_not)
    assert any("the same traffic cannot trigger twice" in w for w in repeat.why_not)

    promoted = NOW + timedelta(hours=20)
    retrained = ChampionState("chat/2", promoted_at=promoted, served_since_promotion=3000, from_drift_retrain=True)
    fresh = WindowSpan(start=promoted, end=promoted + timedelta(hours=24), versions={"chat/2": 3000})
    next_day = promoted + timedelta(hours=24)
    again = decide_retrain(drift_report(window=fresh), signals, History(record, retrained), POLICY, next_day)
    assert again.retrain, again.summary


def test_naive_times_are_refused() -> None:
    with pytest.raises(ValueError, match="timezone-aware"):
        decide_retrain(drift_report(), Signals(UNSAFE, BASELINE), History(), POLICY, datetime(2025, 1, 2))


def test_signals_from_a_drift_report_carry_its_rates() -> None:
    report = drift_report().model_copy(update={"current_rates": UNSAFE, "reference_rates": BASELINE})
    assert Signals.from_report(report, 7) == Signals(UNSAFE, BASELINE, 7)
    assert replace(Signals.from_report(report), new_curated=3).new_curated == 3
