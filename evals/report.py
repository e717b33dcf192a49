"""The eval report: every metric of every suite, with its direction, standard error and per-item scores.

Per-item scores (``MetricResult.items``: item id -> score, plus optional weights for weighted means such as
bits per byte) are what the gate's paired bootstrap resamples, so a candidate and its champion are compared on
the same items. Reports are JSON files (``EvalReport.save`` / ``load_report``) and MLflow artifacts.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class MetricResult(BaseModel):
    model_config = ConfigDict(frozen=True)

    name: str = Field(description="'<suite>/<metric>'.")
    value: float
    higher_is_better: bool
    n: int = Field(description="Items the value is computed from.")
    stderr: float | None = None
    items: dict[str, float] = Field(default_factory=dict, description="Per-item scores (item id -> score).")
    weights: dict[str, float] | None = Field(None, description="Per-item weights when the value is a weighted mean.")
    repeats: list[float] | None = Field(None, description="The value of each repeat, for sampled metrics.")
    description: str = ""


class SuiteResult(BaseModel):
    model_config = ConfigDict(frozen=True)

    name: str
    kind: str
    seconds: float
    data: dict[str, str] = Field(description="Eval-set files used and their SHA-256.")
    metrics: list[MetricResult]
    details: dict[str, Any] = Field(default_factory=dict, description="Counts and example outputs.")

    @classmethod
    def of(
        cls, suite: Any, started: float, data: dict[str, str], metrics: list[MetricResult], details: dict[str, Any]
    ) -> SuiteResult:
        """The result of ``suite`` (its name and kind) begun at ``started`` (``time.perf_counter()``)."""
        return cls(
            name=suite.name,
            kind=suite.kind,
            seconds=time.perf_counter() - started,
            data=data,
            metrics=metrics,
            details=details,
        )


class Screened(BaseModel):
    """What the endpoint's filters did in an ``evals.as_served`` run."""

    model_config = ConfigDict(frozen=True)

    filters: str = Field(description="The filters in front: the classifier version, its threshold, the settings.")
    suites: dict[str, dict[str, int]] = Field(
        default_factory=dict,
        description="Per suite: conversations asked, blocked by the pre-filter, replies the post-filter stopped.",
    )


class EvalReport(BaseModel):
    model_config = ConfigDict(frozen=True)

    model: str = Field(description="What was evaluated: 'chat/3', a folder, or an OpenAI-compatible URL.")
    model_id: str = Field(description="Weights hash of the evaluated model (or the URL and served model name).")
    eval_sets: str = Field(description="Hash of the eval-set manifest: equal hashes mean the same items.")
    snapshot: str
    seed: int
    created_at: str
    seconds: float
    versions: dict[str, str] = Field(default_factory=dict, description="lm-eval, vLLM and scorer versions.")
    suites: list[SuiteResult]
    served: Screened | None = Field(None, description="With evals.as_served: the filters in front, what they did.")

    def metrics(self) -> dict[str, MetricResult]:
        return {m.name: m for s in self.suites for m in s.metrics}

    def save(self, path: Path) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(self.model_dump_json(indent=2), encoding="utf-8")
        tmp.replace(path)
        return path

    def summary(self) -> dict[str, float]:
        return {name: m.value for name, m in self.metrics().items()}


def load_report(path: Path) -> EvalReport:
    return EvalReport.model_validate(json.loads(path.read_text(encoding="utf-8")))


def mean_metric(
    name: str,
    items: Mapping[str, float],
    *,
    higher_is_better: bool,
    description: str = "",
    repeats: Sequence[float] | None = None,
) -> MetricResult:
    """A metric that is the plain mean of per-item scores, with the standard error of that mean (for 0/1
    scores, a proportion, see ``proportion_stderr``)."""
    values = list(items.values())
    n = len(values)
    mean = sum(values) / n if n else float("nan")
    if n and all(v in (0.0, 1.0) for v in values):
        stderr: float | None = proportion_stderr(int(sum(values)), n)
    else:
        stderr = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1) / n) if n > 1 else None
    return MetricResult(
        name=name,
        value=mean,
        higher_is_better=higher_is_better,
        n=n,
        stderr=stderr,
        items=dict(items),
        repeats=list(repeats) if repeats is not None else None,
        description=description,
    )


def proportion_stderr(successes: int, n: int) -> float:
    """Standard error of a proportion, Agresti-Coull's "plus four" form: sqrt(p(1-p)/(n+4)) at
    p = (successes+2)/(n+4). The plain sample formula is 0 at 0/n and n/n, which would claim that 12 refusals
    out of 12 pin the rate exactly and make any margin "in standard errors" empty; this one stays honest there
    and is within a few percent of the plain one in between."""
    p = (successes + 2) / (n + 4)
    return math.sqrt(p * (1 - p) / (n + 4))


def weighted_value(items: Mapping[str, float], weights: Mapping[str, float] | None, keys: Sequence[str]) -> float:
    """The metric over ``keys`` (with repeats): a plain or weighted mean of the item scores."""
    if weights is None:
        return sum(items[k] for k in keys) / len(keys)
    total = sum(weights[k] for k in keys)
    return sum(items[k] * weights[k] for k in keys) / total
