"""The rollout state machine: ``decide(state, verdict, policy, now) -> Transition``, a pure function.

A rollout moves shadow -> canary step 0 .. step k -> watch (champion at 100%) -> finished::

    shadow --pass x N--> canary[0] --pass x N--> ... canary[k] --pass x N--> watch --watch_s elapsed--> finish
       \\________________________ guardrail fail, or failure_limit failures ________________________/--> rollback

- a failed **guardrail** rolls back at once, in any phase;
- a failing verdict counts a failure: ``failures`` is cumulative over the whole rollout (never reset), so a
  flapping canary is aborted eventually; at ``failure_limit`` failures -> rollback, else hold with passes reset;
- ``passes_to_advance`` consecutive passes advance a step (hysteresis); the step after the last canary step is
  promotion (weight 100, phase watch). Every advance resets ``passes`` and starts a new analysis window
  (``phase_started_at = now``);
- an inconclusive verdict holds with the counters unchanged (waiting for samples): it never advances;
- in watch, once ``watch_s`` has passed since promotion, a non-failing analysis finishes the rollout (a failing one
  below the limit holds, so the failure can be confirmed or cleared by the next analysis).

The state lives in the candidate version's registry tags (``to_tags`` / ``from_tags``); the controller
(``monitoring.controller``) reads it, calls ``decide`` and then applies the transition.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Literal, get_args

from monitoring.config import RolloutPolicy
from monitoring.verdict import Verdict

Phase = Literal["shadow", "canary", "watch"]
Action = Literal["hold", "advance", "promote", "rollback", "finish"]
TAG_PREFIX = "rollout."


def _utc(at: datetime, what: str) -> datetime:
    if at.tzinfo is None:
        raise ValueError(f"{what}: naive datetime {at.isoformat()}; pass a timezone-aware datetime (UTC)")
    return at.astimezone(UTC)


@dataclass(frozen=True)
class RolloutState:
    """Where a rollout stands. ``step`` indexes ``policy.steps`` in canary (-1 in shadow, len(steps) in watch);
    ``phase_started_at`` starts the current analysis window; ``baseline_version`` is the champion compared
    against (during watch: the previous champion, the rollback target)."""

    version: str
    phase: Phase
    step: int
    weight: int
    passes: int
    failures: int
    started_at: datetime
    phase_started_at: datetime
    baseline_version: str | None

    def label(self) -> str:
        return f"canary {self.weight}%" if self.phase == "canary" else self.phase

    def to_tags(self) -> dict[str, str]:
        """String tags, all prefixed ``rollout.``; times in ISO 8601 UTC, no baseline as an empty string."""
        return {
            "rollout.version": self.version,
            "rollout.phase": self.phase,
            "rollout.step": str(self.step),
            "rollout.weight": str(self.weight),
            "rollout.passes": str(self.passes),
            "rollout.failures": str(self.failures),
            "rollout.started_at": _utc(self.started_at, "started_at").isoformat(),
            "rollout.phase_started_at": _utc(self.phase_started_at, "phase_started_at").isoformat(),
            "rollout.baseline": self.baseline_version or "",
        }

    @classmethod
    def from_tags(cls, tags: Mapping[str, str]) -> RolloutState | None:
        """The state in ``tags`` (other tags are ignored); None when there is no (or an empty) ``rollout.phase``.
        A present but corrupt value is a ValueError naming the tag."""
        phase = tags.get("rollout.phase")
        if not phase:
            return None
        if phase not in get_args(Phase):
            raise ValueError(f"tag rollout.phase={phase!r}: expected one of {', '.join(get_args(Phase))}")

        def need(key: str) -> str:
            value = tags.get(f"rollout.{key}")
            if value is None or value == "":
                raise ValueError(f"tag rollout.{key} is missing (rollout.phase={phase!r} is set)")
            return value

        def integer(key: str, low: int, high: int | None = None) -> int:
            raw = need(key)
            try:
                value = int(raw)
            except ValueError:
                raise ValueError(f"tag rollout.{key}={raw!r}: expected an integer") from None
            if value < low or (high is not None and value > high):
                raise ValueError(f"tag rollout.{key}={value}: expected {low}..{'' if high is None else high}")
            return value

        def moment(key: str) -> datetime:
            raw = need(key)
            try:
                at = datetime.fromisoformat(raw)
            except ValueError:
                raise ValueError(f"tag rollout.{key}={raw!r}: expected an ISO 8601 time") from None
            if at.tzinfo is None:
                raise ValueError(f"tag rollout.{key}={raw!r}: the time has no time zone")
            return at.astimezone(UTC)

        return cls(
            version=need("version"),
            phase=phase,  # type: ignore[arg-type]  # checked against Phase above
            step=integer("step", -1),
            weight=integer("weight", 0, 100),
            passes=integer("passes", 0),
            failures=integer("failures", 0),
            started_at=moment("started_at"),
            phase_started_at=moment("phase_started_at"),
            baseline_version=tags.get("rollout.baseline") or None,
        )


def start(version: str, baseline_version: str | None, now: datetime) -> RolloutState:
    """A new rollout, in shadow (weight 0) against ``baseline_version`` (the current champion)."""
    now = _utc(now, "now")
    return RolloutState(version, "shadow", -1, 0, 0, 0, now, now, baseline_version)


@dataclass(frozen=True)
class Transition:
    """What to do next. ``state`` is the next state (None after rollback and finish); ``reason`` one line."""

    action: Action
    state: RolloutState | None
    reason: str


def _advance(state: RolloutState, policy: RolloutPolicy, now: datetime, why: str) -> Transition:
    last = len(policy.steps) - 1
    if state.phase == "shadow":
        nxt = replace(state, phase="canary", step=0, weight=policy.steps[0], passes=0, phase_started_at=now)
        return Transition("advance", nxt, f"{why}: shadow -> {nxt.label()}")
    if state.step >= last:  # also a policy that lost steps mid-rollout: promote rather than index past the end
        nxt = replace(state, phase="watch", step=len(policy.steps), weight=100, passes=0, phase_started_at=now)
        return Transition(
            "promote", nxt, f"{why}: {state.label()} -> champion (100%), watched for {policy.watch_s:g} s"
        )
    step = max(state.step + 1, 0)
    nxt = replace(state, step=step, weight=policy.steps[step], passes=0, phase_started_at=now)
    return Transition("advance", nxt, f"{why}: {state.label()} -> {nxt.label()}")


def decide(state: RolloutState, verdict: Verdict, policy: RolloutPolicy, now: datetime) -> Transition:
    """The next step of the rollout given this analysis (see the module docstring for the rules)."""
    now = _utc(now, "now")
    where = state.label()
    if verdict.guardrail_failed:
        return Transition("rollback", None, f"guardrail failed in {where}: {verdict.summary}")
    if verdict.outcome == "fail":
        failures = state.failures + 1
        if failures >= policy.failure_limit:
            why = f"failure {failures} of {policy.failure_limit} allowed in this rollout"
            return Transition("rollback", None, f"{why}, in {where}: {verdict.summary}")
        nxt = replace(state, failures=failures, passes=0)
        why = f"failure {failures} of {policy.failure_limit} before rollback"
        return Transition("hold", nxt, f"{where} held, {why}: {verdict.summary}")
    if state.phase == "watch":
        watched = (now - state.phase_started_at).total_seconds()
        nxt = replace(state, passes=state.passes + 1) if verdict.outcome == "pass" else state
        if watched >= policy.watch_s:
            judged = (
                "the last analysis passed"
                if verdict.outcome == "pass"
                else f"but the watch did not see enough to judge ({verdict.summary})"
            )
            return Transition("finish", None, f"watched {watched:.0f} s >= {policy.watch_s:g} s, {judged}: done")
        return Transition("hold", nxt, f"watch {watched:.0f}/{policy.watch_s:g} s: {verdict.summary}")
    if verdict.outcome == "inconclusive":
        return Transition("hold", state, f"{where} waiting for samples: {verdict.summary}")
    passes = state.passes + 1
    if passes >= policy.passes_to_advance:
        return _advance(state, policy, now, f"{passes} consecutive passing analyses")
    nxt = replace(state, passes=passes)
    return Transition("hold", nxt, f"{where} passed {passes} of {policy.passes_to_advance} needed to advance")
