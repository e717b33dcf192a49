"""Builders of eval reports for the gate and comparison unit tests."""

from __future__ import annotations

from evals.report import EvalReport, MetricResult, SuiteResult

SETS = "a" * 64


def metric(name: str, scores: list[float], *, hib: bool = True, weights: list[float] | None = None) -> MetricResult:
    items = {f"i{k}": v for k, v in enumerate(scores)}
    w = {f"i{k}": x for k, x in enumerate(weights)} if weights else None
    value = (
        sum(v * x for v, x in zip(scores, weights, strict=True)) / sum(weights)
        if weights
        else sum(scores) / len(scores)
    )
    return MetricResult(name=name, value=value, higher_is_better=hib, n=len(scores), items=items, weights=w)


def report(*metrics: MetricResult, model: str = "chat/2", sets: str = SETS) -> EvalReport:
    return EvalReport(
        model=model,
        model_id=model,
        eval_sets=sets,
        snapshot="s" * 64,
        seed=0,
        created_at="2026-11-21T00:00:00+00:00",
        seconds=1.0,
        suites=[SuiteResult(name="s", kind="safety", seconds=1.0, data={}, metrics=list(metrics))],
    )
