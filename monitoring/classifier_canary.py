"""The safety classifier's canary, analysed: promote it, roll it back, or keep watching.

While a version holds the canary alias (``serving.safety.classifier_canary``), the gateway has both it and the
champion judge every prompt the rules let through: one version's verdict is served (the canary's for its share of
conversations), the other's is kept beside it in the request log. So each such request is a paired judgement of
the same prompt by both, and the analysis needs no ground truth to see how they differ:

- **extra blocks**: the canary blocks, the champion passes. Its new false-block risk (live traffic is mostly
  benign), or harm the champion missed; a person can tell from the rows, the rate decides.
- **missed blocks**: the champion blocks, the canary passes. What it stopped catching.
- **disputed blocks**: the share of each version's served blocks whose asker rated the refusal thumbs-down
  (``POST /v1/feedback``), the canary's against the champion's: the false-block signal users give.

    verdict = analyze(rows, champion="safety-classifier/5", canary="safety-classifier/6", policy=policy)
    verdict.action    # "promote" | "rollback" | "hold", with verdict.reason saying why in one line

The rule (``monitoring.config.ClassifierCanaryPolicy``): roll back as soon as a rate is past its limit by ``z``
standard errors; promote once ``min_requests`` paired prompts are in and every rate is within its limit; roll back
a canary still over a limit at ``max_requests`` (not shown safe). Otherwise hold. Pure logic:
``flows.classifier_stages.classifier_canary_stage`` reads the rows and moves the aliases.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from monitoring.config import ClassifierCanaryPolicy

RULE_PREFIX = "classifier."
UNAVAILABLE = "classifier.unavailable"  # a fail-closed block no classifier judged


@dataclass(frozen=True)
class CanaryRow:
    """What the analysis reads of one request-log row judged during the canary."""

    decided_by: str  # the version whose verdict was served (request log: safety_classifier)
    decided_rule: str | None  # the pre-filter rule it blocked with, None when it passed (pre_filter)
    shadow: str  # the other version (safety_shadow_classifier)
    shadow_rule: str | None  # what the other would have done: its rule, or "passed" (safety_shadow_rule)
    rating: int | None = None  # the asker's rating of the answer: 1, -1 or None (feedback_rating)

    def blocked_by(self, version: str) -> bool:
        rule = self.decided_rule if version == self.decided_by else self.shadow_rule
        return bool(rule) and str(rule).startswith(RULE_PREFIX) and rule != UNAVAILABLE


@dataclass(frozen=True)
class Rate:
    k: int
    n: int

    @property
    def value(self) -> float:
        return self.k / self.n if self.n else 0.0

    @property
    def stderr(self) -> float:
        """With one success and one failure added (Agresti-Caffo): never 0, so 0 of 40 against 40 of 40 is not
        "certain", and a rate at 0 or 1 still carries its uncertainty."""
        p = (self.k + 1) / (self.n + 2)
        return math.sqrt(p * (1 - p) / (self.n + 2))

    def __str__(self) -> str:
        return f"{self.k}/{self.n} = {self.value:.3f}"


@dataclass(frozen=True)
class CanaryVerdict:
    action: Literal["promote", "rollback", "hold"]
    reason: str
    paired: int
    extra: Rate  # canary blocks, champion passes
    missed: Rate  # champion blocks, canary passes
    disputed_canary: Rate  # the canary's served blocks rated thumbs-down
    disputed_champion: Rate  # the champion's served blocks rated thumbs-down

    @property
    def disputed_increase(self) -> float:
        return self.disputed_canary.value - self.disputed_champion.value

    @property
    def disputed_stderr(self) -> float:
        return math.hypot(self.disputed_canary.stderr, self.disputed_champion.stderr)

    def stats(self) -> dict[str, float]:
        """The figures behind the decision (tagged on the version, printed by the CLI)."""
        return {
            "paired": self.paired,
            "extra_block_rate": round(self.extra.value, 4),
            "extra_blocks": self.extra.k,
            "missed_block_rate": round(self.missed.value, 4),
            "missed_blocks": self.missed.k,
            "disputed_canary": round(self.disputed_canary.value, 4),
            "disputed_canary_blocks": self.disputed_canary.n,
            "disputed_champion": round(self.disputed_champion.value, 4),
            "disputed_champion_blocks": self.disputed_champion.n,
        }


def analyze(rows: Iterable[CanaryRow], *, champion: str, canary: str, policy: ClassifierCanaryPolicy) -> CanaryVerdict:
    """The decision on ``canary`` against ``champion`` from the rows both judged (others are ignored)."""
    paired = [r for r in rows if {r.decided_by, r.shadow} == {champion, canary}]
    n = len(paired)
    extra = Rate(sum(r.blocked_by(canary) and not r.blocked_by(champion) for r in paired), n)
    missed = Rate(sum(r.blocked_by(champion) and not r.blocked_by(canary) for r in paired), n)

    def disputed(version: str) -> Rate:
        served = [r for r in paired if r.decided_by == version and r.blocked_by(version)]
        return Rate(sum(r.rating == -1 for r in served), len(served))

    d_canary, d_champion = disputed(canary), disputed(champion)

    def verdict(action: Literal["promote", "rollback", "hold"], reason: str) -> CanaryVerdict:
        return CanaryVerdict(action, reason, n, extra, missed, d_canary, d_champion)

    # (name, value, standard error, limit, what it means); the disputed rule only once both versions served blocks
    checks = [
        ("extra blocks", extra.value, extra.stderr, policy.max_extra_block_rate, f"{extra}"),
        ("missed blocks", missed.value, missed.stderr, policy.max_missed_block_rate, f"{missed}"),
    ]
    if d_canary.n and d_champion.n:
        increase = d_canary.value - d_champion.value
        se = math.hypot(d_canary.stderr, d_champion.stderr)
        checks.append(("disputed blocks", increase, se, policy.max_disputed_increase, f"{d_canary} vs {d_champion}"))
    proven = [
        f"{name} {shown} is past {limit} by {(value - limit) / se:.1f} standard errors"
        for name, value, se, limit, shown in checks
        if value - policy.z * se > limit
    ]
    if proven:
        return verdict("rollback", f"{n} paired prompts: " + "; ".join(proven))
    over = [f"{name} {shown} > {limit}" for name, value, _, limit, shown in checks if value > limit]
    within = ", ".join(f"{name} {shown} <= {limit}" for name, value, _, limit, shown in checks if value <= limit)
    if n >= policy.max_requests and over:
        return verdict("rollback", f"still over a limit after {n} paired prompts: " + "; ".join(over))
    if n < policy.min_requests:
        return verdict("hold", f"{n} of {policy.min_requests} paired prompts so far")
    if over:
        return verdict("hold", f"{n} paired prompts, over a limit but not yet by {policy.z:g} standard errors: "
                       + "; ".join(over))  # fmt: skip
    return verdict("promote", f"{n} paired prompts, every rate within its limit: {within}")
