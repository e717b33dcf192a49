"""The rollout state machine: every phase x verdict, sequences (flapping, waiting forever, advancing, promotion,
the end of the watch) and the state's round trip through registry tags. Verdicts are built directly."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest

from monitoring.canary import Check, Verdict
from monitoring.config import RolloutPolicy
from monitoring.rollout import RolloutState, Transition, decide, start
from monitoring.verdict import Outcome

POLICY = RolloutPolicy(steps=[5, 25, 50], passes_to_advance=2, failure_limit=2, watch_s=600)
T0 = datetime(2025, 1, 1, tzinfo=UTC)
NOW = T0 + timedelta(minutes=5)


def verdict(outcome: Outcome, guardrail: bool = False) -> Verdict:
    """A one-check verdict: ``guardrail`` makes the check a guardrail (only meaningful with fail)."""
    name = "success_rate" if guardrail else "error_rate"
    check = Check(name, not guardrail, outcome, 0.5, 0.9, 0.99, 0.001, guardrail, f"{outcome} for the test")
    return Verdict.from_checks([check])


def state(phase: str = "canary", step: int = 0, passes: int = 0, failures: int = 0, **kw: Any) -> RolloutState:
    weight = {"shadow": 0, "watch": 100}.get(phase, POLICY.steps[step] if phase == "canary" else 0)
    fields: dict[str, Any] = dict(
        version="7",
        phase=phase,
        step=step,
        weight=weight,
        passes=passes,
        failures=failures,
        started_at=T0,
        phase_started_at=T0,
        baseline_version="6",
    )
    return RolloutState(**{**fields, **kw})


SHADOW = state("shadow", -1)
WATCH = state("watch", 3)


@pytest.mark.parametrize(
    ("before", "result", "action", "after"),
    [
        # shadow
        pytest.param(SHADOW, verdict("pass"), "hold", replace(SHADOW, passes=1), id="shadow-first-pass-holds"),
        pytest.param(
            replace(SHADOW, passes=1),
            verdict("pass"),
            "advance",
            state("canary", 0, phase_started_at=NOW),
            id="shadow-second-pass-advances-to-canary-5",
        ),
        pytest.param(SHADOW, verdict("inconclusive"), "hold", SHADOW, id="shadow-inconclusive-waits"),
        pytest.param(
            replace(SHADOW, passes=1),
            verdict("fail"),
            "hold",
            replace(SHADOW, failures=1),
            id="shadow-first-fail-holds-and-resets-passes",
        ),
        pytest.param(
            replace(SHADOW, failures=1), verdict("fail"), "rollback", None, id="shadow-second-fail-rolls-back"
        ),
        pytest.param(SHADOW, verdict("fail", guardrail=True), "rollback", None, id="shadow-guardrail-rolls-back"),
        # canary
        pytest.param(
            state(passes=1), verdict("pass"), "advance", state(step=1, phase_started_at=NOW), id="canary-5-to-25"
        ),
        pytest.param(
            state(step=1, passes=1, failures=1),
            verdict("pass"),
            "advance",
            state(step=2, failures=1, phase_started_at=NOW),
            id="advance-keeps-the-failure-count",
        ),
        pytest.param(
            state(step=2, passes=1),
            verdict("pass"),
            "promote",
            state("watch", 3, phase_started_at=NOW),
            id="last-step-promotes",
        ),
        pytest.param(state(), verdict("inconclusive"), "hold", state(), id="canary-inconclusive-waits"),
        pytest.param(state(passes=1), verdict("fail"), "hold", state(failures=1), id="canary-fail-holds"),
        pytest.param(state(failures=1), verdict("fail"), "rollback", None, id="canary-fail-at-limit-rolls-back"),
        pytest.param(state(), verdict("fail", guardrail=True), "rollback", None, id="canary-guardrail-at-once"),
        # watch
        pytest.param(WATCH, verdict("pass"), "hold", replace(WATCH, passes=1), id="watch-pass-before-watch-s-holds"),
        pytest.param(WATCH, verdict("inconclusive"), "hold", WATCH, id="watch-inconclusive-holds"),
        pytest.param(WATCH, verdict("fail"), "hold", replace(WATCH, failures=1), id="watch-first-fail-holds"),
        pytest.param(replace(WATCH, failures=1), verdict("fail"), "rollback", None, id="watch-fail-at-limit"),
        pytest.param(WATCH, verdict("fail", guardrail=True), "rollback", None, id="watch-guardrail-rolls-back"),
        pytest.param(
            replace(WATCH, phase_started_at=NOW - timedelta(seconds=600)),
            verdict("pass"),
            "finish",
            None,
            id="watch-pass-after-watch-s-finishes",
        ),
        pytest.param(
            replace(WATCH, phase_started_at=NOW - timedelta(seconds=600)),
            verdict("inconclusive"),
            "finish",
            None,
            id="watch-inconclusive-after-watch-s-finishes",
        ),
        pytest.param(
            replace(WATCH, phase_started_at=NOW - timedelta(seconds=900)),
            verdict("fail"),
            "hold",
            replace(WATCH, phase_started_at=NOW - timedelta(seconds=900), failures=1),
            id="watch-fail-after-watch-s-holds-instead-of-finishing",
        ),
    ],
)
def test_decide(before: RolloutState, result: Verdict, action: str, after: RolloutState | None) -> None:
    t = decide(before, result, POLICY, NOW)
    assert (t.action, t.state) == (action, after), t.reason
    assert t.reason and "\n" not in t.reason


@pytest.mark.parametrize(
    ("action", "words"),
    [
        ("guardrail", ["guardrail failed", "success_rate"]),
        ("rollback", ["failure 2 of 2", "error_rate"]),
        ("finish", ["did not see enough"]),
        ("wait", ["waiting for samples"]),
    ],
)
def test_reasons_say_why(action: str, words: list[str]) -> None:
    cases = {
        "guardrail": (state(), verdict("fail", guardrail=True)),
        "rollback": (state(failures=1), verdict("fail")),
        "finish": (replace(WATCH, phase_started_at=NOW - timedelta(seconds=600)), verdict("inconclusive")),
        "wait": (state(), verdict("inconclusive")),
    }
    before, result = cases[action]
    reason = decide(before, result, POLICY, NOW).reason
    assert all(w in reason for w in words), reason


def run(outcomes: str, s: RolloutState, policy: RolloutPolicy = POLICY) -> list[Transition]:
    """Feed a sequence of verdicts (p = pass, f = fail, g = guardrail fail, i = inconclusive), a minute apart,
    until the rollout ends."""
    out: list[Transition] = []
    for k, code in enumerate(outcomes):
        result = {"p": verdict("pass"), "f": verdict("fail"), "g": verdict("fail", True), "i": verdict("inconclusive")}
        t = decide(s, result[code], policy, T0 + timedelta(minutes=k + 1))
        out.append(t)
        if t.state is None:
            break
        s = t.state
    return out


def test_a_flapping_canary_is_rolled_back_at_the_second_failure_and_never_advances() -> None:
    transitions = run("pfpfpp", state())
    assert [t.action for t in transitions] == ["hold", "hold", "hold", "rollback"]


def test_inconclusive_forever_never_advances() -> None:
    transitions = run("i" * 100, state("shadow", -1))
    assert {t.action for t in transitions} == {"hold"}
    assert transitions[-1].state == state("shadow", -1)


def test_k_consecutive_passes_advance_and_a_failure_resets_the_count() -> None:
    policy = RolloutPolicy(passes_to_advance=3, failure_limit=3)
    actions = [t.action for t in run("ppfppp", state(), policy)]
    assert actions == ["hold", "hold", "hold", "hold", "hold", "advance"]


def test_a_healthy_rollout_walks_every_step_to_promotion_then_finishes() -> None:
    s = start("7", "6", T0)
    assert (s.phase, s.step, s.weight) == ("shadow", -1, 0)
    transitions = run("pp" * 4 + "iiii", s, replace_policy(watch_s=180))
    assert [t.action for t in transitions] == ["hold", "advance"] * 3 + ["hold", "promote", "hold", "hold", "finish"]
    weights = [t.state.weight for t in transitions if t.state is not None and t.action in ("advance", "promote")]
    assert weights == [5, 25, 50, 100]
    promoted = transitions[7].state
    assert (
        promoted is not None and promoted.phase == "watch" and promoted.step == 3 and promoted.baseline_version == "6"
    )


def replace_policy(**kw: Any) -> RolloutPolicy:
    return RolloutPolicy.model_validate({**POLICY.model_dump(), **kw})


def test_tags_round_trip() -> None:
    for s in (start("7", "6", T0), state(step=2, passes=1, failures=1), replace(WATCH, baseline_version=None)):
        tags = s.to_tags()
        assert all(k.startswith("rollout.") and isinstance(v, str) for k, v in tags.items())
        assert RolloutState.from_tags({**tags, "gate.status": "passed"}) == s


def test_tags_are_utc_iso() -> None:
    local = datetime(2025, 1, 1, 5, 0, tzinfo=timezone(timedelta(hours=2)))
    tags = start("7", "6", local).to_tags()
    assert tags["rollout.started_at"] == "2025-01-01T03:00:00+00:00"


@pytest.mark.parametrize("tags", [{}, {"rollout.phase": ""}, {"gate.status": "passed"}], ids=["none", "empty", "other"])
def test_no_rollout_phase_is_no_state(tags: dict[str, str]) -> None:
    assert RolloutState.from_tags(tags) is None


@pytest.mark.parametrize(
    ("key", "value", "match"),
    [
        ("rollout.phase", "canery", "rollout.phase"),
        ("rollout.step", "two", "rollout.step.*integer"),
        ("rollout.weight", "150", "rollout.weight"),
        ("rollout.passes", "-1", "rollout.passes"),
        ("rollout.started_at", "yesterday", "rollout.started_at.*ISO"),
        ("rollout.phase_started_at", "2025-01-01T00:00:00", "time zone"),
        ("rollout.version", "", "rollout.version is missing"),
    ],
)
def test_corrupt_tags_are_a_clear_error(key: str, value: str, match: str) -> None:
    tags = {**state().to_tags(), key: value}
    with pytest.raises(ValueError, match=match):
        RolloutState.from_tags(tags)


def test_naive_times_are_refused() -> None:
    with pytest.raises(ValueError, match="naive"):
        start("7", "6", datetime(2025, 1, 1))
    with pytest.raises(ValueError, match="naive"):
        decide(state(), verdict("pass"), POLICY, datetime(2025, 1, 1))


@pytest.mark.parametrize("steps", [[], [5, 5], [50, 25], [0, 50], [5, 100]], ids=str)
def test_invalid_steps_are_refused(steps: list[int]) -> None:
    with pytest.raises(ValueError):
        RolloutPolicy(steps=steps)
