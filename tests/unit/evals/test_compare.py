"""Paired comparisons against a reference report (base model, SFT parent)."""

from __future__ import annotations

from support.report_helpers import metric, report

from evals.compare import compare, render_comparison
from evals.gate import BootstrapSpec

SPEC = BootstrapSpec(samples=500, seed=0)


def test_directions_follow_the_whole_interval_oriented_by_the_metric() -> None:
    tuned = report(
        metric("quality/exact_match", [1.0] * 30 + [0.0] * 10),
        metric("toxicity/toxic_share", [0.0] * 40, hib=False),
        metric("safety/refusal_rate", [1.0, 0.0] * 20),
    )
    base = report(
        metric("quality/exact_match", [0.0] * 40),
        metric("toxicity/toxic_share", [1.0] * 20 + [0.0] * 20, hib=False),
        metric("safety/refusal_rate", [0.0, 1.0] * 20),
        model="chat-base/1",
    )
    rows = {c.metric: c for c in compare(tuned, base, SPEC)}
    assert rows["quality/exact_match"].direction == "better"
    assert rows["quality/exact_match"].improvement == 0.75
    assert rows["toxicity/toxic_share"].direction == "better"  # lower toxicity is the improvement
    assert rows["toxicity/toxic_share"].improvement == 0.5
    assert rows["safety/refusal_rate"].direction == "same"  # same rate, items swapped: indistinguishable
    worse = {c.metric: c for c in compare(base, tuned, SPEC)}
    assert worse["quality/exact_match"].direction == "worse"
    md = render_comparison("Against the base model", "chat-base/1", list(rows.values()), SPEC.confidence)
    assert "| quality/exact_match | ↑ | 0.000 | 0.750 | +0.750 |" in md and "better" in md


def test_other_eval_sets_or_missing_metrics_give_no_rows() -> None:
    tuned = report(metric("quality/exact_match", [1.0, 0.0]), metric("a/b", [1.0, 1.0]))
    assert compare(tuned, report(metric("quality/exact_match", [0.0, 0.0]), sets="b" * 64), SPEC) == []
    rows = compare(tuned, report(metric("quality/exact_match", [0.0, 0.0])), SPEC)
    assert [c.metric for c in rows] == ["quality/exact_match"]
    assert "no shared items" in render_comparison("x", "y", [], 0.95)
