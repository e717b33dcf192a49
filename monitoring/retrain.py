"""The retrain decision: ``decide_retrain(drift, signals, history, policy, now) -> RetrainDecision``, a pure function.

A retrain is triggered only when **every** one of these holds (each failing one is a ``why_not`` line):

1. **Drift**: the drift report says ``drifted`` (an inconclusive report never triggers).
2. **A quality signal** (at least one; each that fired is a ``reasons`` line):
   - the window's safety-hit rate exceeds the champion baseline's by more than ``safety_hit_tolerance``, or its
     refusal rate by more than ``refusal_tolerance``: a one-sided two-proportion z-test (``monitoring.stats``)
     of H0 "rise <= tolerance", significant at ``alpha``, with ``min_rate_samples`` answered requests a side;
   - at least ``min_new_curated`` new curated conversations since the last retrain's snapshot.
3. **Cooldown**: ``cooldown_hours`` have passed since the last triggered retrain.
4. **Loop guard** (a retrain must never trigger itself):
   - *same traffic*: the window starts at or after the end of the window that triggered the last retrain, so
     the traffic that caused one retrain (or any window overlapping it) cannot cause another;
   - *the champion's traffic*: at least ``min_champion_share`` of the window's answered requests were served by
     the current champion (a window served mostly by the previous champion, before a promotion, or by a canary
     says nothing about the champion and its reference);
   - *a retrained champion sees new traffic first*: when the champion itself came out of a drift retrain, the
     window starts at or after its promotion and it has served ``min_samples_after_retrain`` requests since.
     Otherwise a retrain whose new data did not move the reference (too few curated conversations, a snapshot
     that left the drifted prompts out) would be judged on the traffic that caused it, and loop.
   The guard needs the report's ``window`` (``WindowSpan``) and the history's champion; without them it cannot
   be checked and nothing is triggered.

The decision records its evidence (the drift verdict and numbers, every signal with its test, the cooldown, each
guard with the values it compared) as JSON-able data, and a triggering decision yields the ``RetrainRecord`` the
next decision's history reads (``RetrainDecision.record()``). The caller keeps that history: the last trigger
from its decision log, the champion's version, promotion time, served requests and whether it came out of a drift
retrain (a lineage tag the retrain flow sets on the version it registers).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field

from monitoring import stats
from monitoring.drift import DriftReport
from monitoring.drift_config import RetrainPolicy
from monitoring.window import WindowRates, WindowSpan

__all__ = [
    "ChampionState",
    "QualitySignals",
    "RetrainDecision",
    "RetrainHistory",
    "RetrainRecord",
    "Signals",
    "decide_retrain",
]


class QualitySignals(Protocol):
    """What the decision reads besides drift: the window's rates, the champion baseline's, curated data."""

    @property
    def current(self) -> WindowRates | None: ...  # the drift window's requests
    @property
    def baseline(self) -> WindowRates | None: ...  # the champion's baseline (e.g. its first window after promotion)
    @property
    def new_curated(self) -> int: ...  # curated conversations added since the last retrain's snapshot


@dataclass(frozen=True)
class Signals:
    """A plain ``QualitySignals``."""

    current: WindowRates | None
    baseline: WindowRates | None
    new_curated: int = 0

    @classmethod
    def from_report(cls, drift: DriftReport, new_curated: int = 0) -> Signals:
        """The rates the drift report carries (its window vs its reference rates)."""
        return cls(drift.current_rates, drift.reference_rates, new_curated)


class RetrainRecord(BaseModel):
    """What a triggered retrain leaves for the next decision: when, which traffic window, which champion."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    at: AwareDatetime
    window_start: AwareDatetime
    window_end: AwareDatetime
    champion_version: str


@dataclass(frozen=True)
class ChampionState:
    """The serving champion: its version (as the request log names it, e.g. ``chat/3``), when it was promoted,
    how many requests it answered since, and whether it came out of a drift-triggered retrain."""

    version: str
    promoted_at: datetime | None
    served_since_promotion: int
    from_drift_retrain: bool = False


class RetrainHistory(Protocol):
    """The decision's memory, kept by the caller (decision log + registry)."""

    @property
    def last_trigger(self) -> RetrainRecord | None: ...
    @property
    def champion(self) -> ChampionState | None: ...


class RetrainDecision(BaseModel):
    """Retrain or not: ``reasons`` says what spoke for it (drift, each quality signal that fired), ``why_not``
    every condition that failed (empty exactly when ``retrain``), ``evidence`` the numbers behind both
    (JSON-able)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    retrain: bool
    at: AwareDatetime
    reasons: list[str] = Field(default_factory=list)
    why_not: list[str] = Field(default_factory=list)
    evidence: dict[str, Any] = Field(default_factory=dict)
    window_start: AwareDatetime | None = None
    window_end: AwareDatetime | None = None
    champion_version: str | None = None

    @property
    def summary(self) -> str:
        if self.retrain:
            return "retrain: " + "; ".join(self.reasons)
        return "no retrain: " + "; ".join(self.why_not)

    def record(self) -> RetrainRecord | None:
        """The history entry of a triggered retrain (None when this decision did not trigger one)."""
        if not self.retrain:
            return None
        assert self.window_start and self.window_end and self.champion_version, "a trigger has passed the guard"
        return RetrainRecord(
            at=self.at,
            window_start=self.window_start,
            window_end=self.window_end,
            champion_version=self.champion_version,
        )

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json")

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RetrainDecision:
        return cls.model_validate(data)


def _utc(at: datetime, what: str) -> datetime:
    if at.tzinfo is None:
        raise ValueError(f"{what}: naive datetime {at.isoformat()}; pass a timezone-aware datetime (UTC)")
    return at.astimezone(UTC)


def _iso(at: datetime | None) -> str | None:
    return None if at is None else _utc(at, "time").isoformat()


def _rate_signal(
    name: str,
    current: WindowRates | None,
    baseline: WindowRates | None,
    tolerance: float,
    policy: RetrainPolicy,
) -> tuple[bool, str, dict[str, Any]]:
    """(fired, one line, evidence) of one rate-rise test."""
    counts = {
        "safety_hit_rate": lambda r: (r.safety_hits, r.answered),
        "refusal_rate": lambda r: (r.refusals, r.completed),
    }[name]
    evidence: dict[str, Any] = {"tolerance": tolerance, "alpha": policy.alpha}
    if current is None or baseline is None:
        return False, f"{name}: no {'window' if current is None else 'baseline'} rates", evidence
    (xc, nc), (xb, nb) = counts(current), counts(baseline)
    evidence.update(current=[xc, nc], baseline=[xb, nb])
    min_n = policy.min_rate_samples
    if nc < min_n or nb < min_n:
        return False, f"{name}: too few requests to test (window {nc}, baseline {nb}, need {min_n})", evidence
    pc, pb = xc / nc, xb / nb
    p = stats.proportion_excess_p_value(xc, nc, xb, nb, tolerance)
    fired = p < policy.alpha
    evidence.update(current_rate=pc, baseline_rate=pb, diff=pc - pb, p_value=p, fired=fired)
    line = f"{name} {pc:.3f} ({xc}/{nc}) vs baseline {pb:.3f} ({xb}/{nb}), rise {pc - pb:+.3f} vs {tolerance:g}, "
    line += f"p={p:.2g}: " + ("risen" if fired else "not risen beyond the tolerance")
    return fired, line, evidence


def decide_retrain(
    drift: DriftReport,
    signals: QualitySignals,
    history: RetrainHistory,
    policy: RetrainPolicy,
    now: datetime,
) -> RetrainDecision:
    """Whether this drift report should trigger a retrain (see the module docstring for the rules)."""
    now = _utc(now, "now")
    reasons: list[str] = []
    why_not: list[str] = []
    window, champion, last = drift.window, history.champion, history.last_trigger
    evidence: dict[str, Any] = {
        "drift": {
            "status": drift.status,
            "reason": drift.reason,
            "drifted_share": drift.drifted_share,
            "embedding_score": drift.embedding.score if drift.embedding else None,
            "reference_n": drift.reference_n,
            "current_n": drift.current_n,
            "config_hash": drift.config_hash,
        },
        "policy": policy.model_dump(mode="json"),
        "policy_hash": policy.config_hash(),
    }

    # 1. drift
    if drift.drifted:
        reasons.append(f"drift: {drift.reason}")
    elif drift.status == "inconclusive":
        why_not.append(f"drift inconclusive: {drift.reason}")
    else:
        why_not.append(f"no drift: {drift.reason}")

    # 2. quality signals
    fired_any = False
    quality: dict[str, Any] = {}
    for name, tolerance in (
        ("safety_hit_rate", policy.safety_hit_tolerance),
        ("refusal_rate", policy.refusal_tolerance),
    ):
        fired, line, ev = _rate_signal(name, signals.current, signals.baseline, tolerance, policy)
        quality[name] = {**ev, "summary": line}
        if fired:
            fired_any = True
            reasons.append(line)
    curated_fired = signals.new_curated >= policy.min_new_curated
    quality["new_curated"] = {"count": signals.new_curated, "minimum": policy.min_new_curated, "fired": curated_fired}
    if curated_fired:
        fired_any = True
        reasons.append(f"{signals.new_curated} new curated conversations >= {policy.min_new_curated}")
    evidence["quality"] = quality
    if not fired_any:
        lines = [quality[n]["summary"] for n in ("safety_hit_rate", "refusal_rate")]
        lines.append(f"{signals.new_curated} new curated conversations < {policy.min_new_curated}")
        why_not.append("no quality signal: " + "; ".join(lines))

    # 3. cooldown and 4. loop guard
    blocked, evidence["cooldown"] = _cooldown(last, policy, now)
    why_not += blocked
    blocked, evidence["loop_guard"] = _loop_guard(window, champion, last, policy)
    why_not += blocked

    evidence["now"] = now.isoformat()
    return RetrainDecision(
        retrain=not why_not,
        at=now,
        reasons=reasons,
        why_not=why_not,
        evidence=evidence,
        window_start=window.start if window else None,
        window_end=window.end if window else None,
        champion_version=champion.version if champion else None,
    )


def _cooldown(last: RetrainRecord | None, policy: RetrainPolicy, now: datetime) -> tuple[list[str], dict[str, Any]]:
    evidence: dict[str, Any] = {"hours": policy.cooldown_hours, "last_trigger_at": None}
    if last is None:
        return [], evidence
    elapsed_h = (now - _utc(last.at, "last_trigger.at")).total_seconds() / 3600
    evidence.update(last_trigger_at=_iso(last.at), elapsed_hours=elapsed_h)
    if elapsed_h < policy.cooldown_hours:
        return [
            f"cooldown: the last retrain was triggered {elapsed_h:.1f} h ago (< {policy.cooldown_hours:g} h)"
        ], evidence
    return [], evidence


def _loop_guard(
    window: WindowSpan | None, champion: ChampionState | None, last: RetrainRecord | None, policy: RetrainPolicy
) -> tuple[list[str], dict[str, Any]]:
    """The loop guard's failing conditions and what it compared (see the module docstring)."""
    blocked: list[str] = []
    evidence: dict[str, Any] = {
        "window_start": _iso(window.start) if window else None,
        "window_end": _iso(window.end) if window else None,
        "last_trigger_window_end": _iso(last.window_end) if last else None,
    }
    if window is None:
        blocked.append("loop guard: the drift report has no window span, so its traffic cannot be checked")
    if champion is None:
        blocked.append("loop guard: no champion is serving, nothing to retrain from")
    if window is None or champion is None:
        return blocked, evidence
    if last is not None and window.start < last.window_end:
        blocked.append(
            f"loop guard: the window starts {_iso(window.start)}, before the end of the window that triggered the "
            f"last retrain ({_iso(last.window_end)}): the same traffic cannot trigger twice"
        )
    served = sum(window.versions.values())
    by_champion = window.versions.get(champion.version, 0)
    share = by_champion / served if served else 0.0
    evidence.update(
        champion=champion.version,
        champion_share=share,
        champion_served_in_window=by_champion,
        window_answered=served,
        champion_promoted_at=_iso(champion.promoted_at),
        champion_from_drift_retrain=champion.from_drift_retrain,
        champion_served_since_promotion=champion.served_since_promotion,
    )
    who = f"loop guard: the champion {champion.version}"
    if share < policy.min_champion_share:
        blocked.append(
            f"{who} served {share:.0%} of the window ({by_champion}/{served}) < {policy.min_champion_share:.0%}"
        )
    if champion.from_drift_retrain:
        promoted = champion.promoted_at
        if promoted is None or window.start < _utc(promoted, "champion.promoted_at"):
            blocked.append(
                f"{who} came out of a drift retrain and the window starts {_iso(window.start)}, before its "
                f"promotion ({_iso(promoted) or 'unknown'})"
            )
        if champion.served_since_promotion < policy.min_samples_after_retrain:
            blocked.append(
                f"{who} came out of a drift retrain and has served {champion.served_since_promotion} requests since "
                f"its promotion (< {policy.min_samples_after_retrain})"
            )
    return blocked, evidence
