"""Paired comparisons of two eval reports on the same items: ``compare(report, reference, spec)``, pure.

The gate report shows a version against references beside its champion: the base model it was fine-tuned from
("what did training buy?") and, for a preference-tuned version, its SFT parent ("what did alignment buy, and at
what cost?"). Each metric both reports hold is compared on the items they share, with the same paired percentile
bootstrap the gate uses (``evals.gate.paired_bootstrap``), so "better" means the whole interval of the
improvement lies above zero, "worse" below it, and anything else is "same" (indistinguishable on these items).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from evals.gate import BootstrapSpec, paired_bootstrap
from evals.report import EvalReport, weighted_value

Direction = Literal["better", "worse", "same"]


@dataclass(frozen=True)
class PairedComparison:
    metric: str
    higher_is_better: bool
    value: float  # on the shared items
    reference_value: float
    improvement: float  # oriented: positive is better, whatever the metric's direction
    ci_low: float
    ci_high: float
    n_paired: int

    @property
    def direction(self) -> Direction:
        if self.ci_low > 0:
            return "better"
        if self.ci_high < 0:
            return "worse"
        return "same"


def compare(report: EvalReport, reference: EvalReport, spec: BootstrapSpec) -> list[PairedComparison]:
    """Every metric of ``report`` that ``reference`` also holds with per-item scores, on their shared items.
    Reports from different eval sets share no comparable items: the result is empty."""
    if report.eval_sets != reference.eval_sets:
        return []
    theirs = reference.metrics()
    out = []
    for name, m in report.metrics().items():
        r = theirs.get(name)
        keys = sorted(set(m.items) & set(r.items)) if r is not None else []
        if r is None or len(keys) < 2:
            continue
        point, low, high = paired_bootstrap(m, r, keys, spec)
        out.append(
            PairedComparison(
                metric=name,
                higher_is_better=m.higher_is_better,
                value=weighted_value(m.items, m.weights, keys),
                reference_value=weighted_value(r.items, r.weights, keys),
                improvement=point,
                ci_low=low,
                ci_high=high,
                n_paired=len(keys),
            )
        )
    return out


def render_comparison(title: str, reference: str, rows: Sequence[PairedComparison], confidence: float) -> str:
    """A Markdown section: the version against ``reference``, metric by metric."""
    lines = [
        f"## {title}",
        "",
        f"Paired on the same items ({confidence:.0%} bootstrap CI of the improvement; positive is better).",
        "",
        f"| metric | dir | {reference} | this version | improvement | CI | n | |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for c in rows:
        arrow = "↑" if c.higher_is_better else "↓"
        lines.append(
            f"| {c.metric} | {arrow} | {c.reference_value:.3f} | {c.value:.3f} | {c.improvement:+.3f} "
            f"| [{c.ci_low:+.3f}, {c.ci_high:+.3f}] | {c.n_paired} | {c.direction} |"
        )
    if not rows:
        lines.append("| (no shared items: the reports come from different eval sets) | | | | | | | |")
    return "\n".join(lines) + "\n"
