"""The result types of a rollout analysis: one ``Check`` per metric and the ``Verdict`` that combines them.

``monitoring.canary`` produces verdicts and ``monitoring.rollout.decide`` consumes them; the controller logs
``Verdict.metrics()`` to the tracker and ``Verdict.to_json()`` next to the decision.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any, Literal

Outcome = Literal["pass", "fail", "inconclusive"]


@dataclass(frozen=True)
class Check:
    """One metric of one analysis.

    ``threshold`` is the floor of a guardrail (or of an absolute check such as the shadow similarity) and the
    allowed difference candidate - baseline of a comparison. ``guardrail``: an absolute floor whose failure rolls
    back at once. ``reason`` is one readable line with the numbers (without the check's name).
    """

    name: str
    higher_is_better: bool
    outcome: Outcome
    candidate: float | None
    baseline: float | None
    threshold: float
    p_value: float | None
    guardrail: bool
    reason: str


@dataclass(frozen=True)
class Verdict:
    """The combined result: fail if any check failed, else inconclusive if any was, else pass.

    ``subject`` names the candidate's side in ``metrics()`` (canary, shadow or watch)."""

    outcome: Outcome
    checks: tuple[Check, ...]
    summary: str
    subject: str = "canary"
    candidate_n: int = 0
    baseline_n: int = 0

    @classmethod
    def from_checks(
        cls, checks: Iterable[Check], subject: str = "canary", candidate_n: int = 0, baseline_n: int = 0
    ) -> Verdict:
        checks = tuple(checks)
        outcomes = {c.outcome for c in checks}
        outcome: Outcome = "fail" if "fail" in outcomes else "inconclusive" if "inconclusive" in outcomes else "pass"
        summary = _summary(outcome, checks, subject, candidate_n, baseline_n)
        return cls(outcome, checks, summary, subject, candidate_n, baseline_n)

    @property
    def guardrail_failed(self) -> bool:
        return any(c.guardrail and c.outcome == "fail" for c in self.checks)

    @property
    def failing(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.checks if c.outcome == "fail")

    @property
    def inconclusive(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.checks if c.outcome == "inconclusive")

    def metrics(self) -> dict[str, float]:
        """Flat numbers for the tracker: ``<subject>.<check>`` and ``baseline.<check>``, plus the sample sizes."""
        out: dict[str, float] = {f"{self.subject}.n": float(self.candidate_n), "baseline.n": float(self.baseline_n)}
        for c in self.checks:
            if c.candidate is not None:
                out[f"{self.subject}.{c.name}"] = c.candidate
            if c.baseline is not None:
                out[f"baseline.{c.name}"] = c.baseline
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "outcome": self.outcome,
            "summary": self.summary,
            "subject": self.subject,
            "candidate_n": self.candidate_n,
            "baseline_n": self.baseline_n,
            "guardrail_failed": self.guardrail_failed,
            "checks": [asdict(c) for c in self.checks],
        }


def _summary(outcome: Outcome, checks: tuple[Check, ...], subject: str, cand_n: int, base_n: int) -> str:
    sizes = f"{cand_n} pairs" if subject == "shadow" else f"{subject} n={cand_n}, baseline n={base_n}"
    if outcome == "pass":
        return f"pass: {len(checks)} checks ({sizes})"
    # checks that share a reason (typically "too few samples") are listed once, by name
    grouped: dict[str, list[str]] = {}
    for c in checks:
        if c.outcome == outcome:
            grouped.setdefault(c.reason, []).append(c.name + (" [guardrail]" if c.guardrail else ""))
    parts = [f"{', '.join(names)}: {reason}" for reason, names in grouped.items()]
    return f"{outcome}: " + "; ".join(parts) + f" ({sizes})"
