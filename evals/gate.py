"""The promotion gate: ``decide(report, champion_report, policy) -> GateDecision``, a pure function.

For every rule of the policy (``configs/gates/*.yaml``):

1. **Floor** (absolute): ``min`` for a higher-is-better metric, ``max`` for a lower-is-better one.
2. **Non-regression** against the current champion, when there is one and the rule has a ``tolerance``: both
   reports must come from the same eval set (equal ``eval_sets`` hash, so the items are the same); the paired
   difference on the shared items, oriented so that positive is better, gets a percentile bootstrap confidence
   interval (items resampled together for both models). A regression counts only when the whole interval lies
   below ``-tolerance``: "worse beyond the tolerance, and the data say so". A point estimate below the tolerance
   with an interval that reaches above it is noise, and passes with that reason.

A metric missing from the report fails its rule (a gate never passes on what it did not measure). With no
champion, floors alone decide. The overall decision passes only when every rule passes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import Field, model_validator

from core import config as cfgio
from core.config import StrictModel
from core.errors import ConfigError
from evals.report import EvalReport, MetricResult, weighted_value

Verdict = Literal["pass", "fail"]


class Rule(StrictModel):
    min: float | None = Field(None, description="Floor for a higher-is-better metric (value must be >= min).")
    max: float | None = Field(None, description="Ceiling for a lower-is-better metric (value must be <= max).")
    tolerance: float | None = Field(
        None, ge=0, description="Allowed regression vs the champion, in metric units; null: no champion check."
    )

    @model_validator(mode="after")
    def _one_bound(self) -> Rule:
        if self.min is not None and self.max is not None:
            raise ValueError("give min (higher is better) or max (lower is better), not both")
        return self


class BootstrapSpec(StrictModel):
    samples: int = Field(2000, ge=100, description="Bootstrap resamples of the paired items.")
    confidence: float = Field(0.95, gt=0.5, lt=1, description="Two-sided confidence level of the interval.")
    seed: int = Field(0, description="Seed of the resampling (the decision is reproducible).")


class Measurement(StrictModel):
    """What a model this policy is made for measured, on one CPU and precision: the evidence behind the floors."""

    cpu: str = Field(description="Where it was trained and evaluated: CPU model and ISA class (avx2, avx512_bf16).")
    dtype: Literal["float32", "bfloat16"] = Field(description="Precision of the eval engine (evals.engine.dtype).")
    metrics: dict[str, tuple[float, float]] = Field(description="'suite/metric' -> [value, stderr] as measured.")

    @model_validator(mode="after")
    def _stderrs_positive(self) -> Measurement:
        zero = [name for name, (_, stderr) in self.metrics.items() if not stderr > 0]
        if zero:
            raise ValueError(f"a measurement's stderr must be > 0 (a zero claims certainty): {', '.join(zero)}")
        return self


class GatePolicy(StrictModel):
    name: str = Field(description="Policy name, recorded with every decision.")
    description: str = Field("", description="What environment the thresholds are for.")
    bootstrap: BootstrapSpec = Field(default_factory=BootstrapSpec, description="The paired bootstrap.")
    rules: dict[str, Rule] = Field(description="Per metric ('suite/metric'): floor and/or regression tolerance.")
    margin_se: float | None = Field(
        None,
        gt=0,
        description="Every floor sits at least this many standard errors below (every ceiling above) each entry of "
        "'measured', so the verdict does not flip with the CPU or the precision (checked by floor_margins).",
    )
    measured: list[Measurement] = Field(
        default_factory=list, description="Measurements of the model this policy is for (scripts/calibrate_gate.py)."
    )


class PolicyFile(StrictModel):
    gate: GatePolicy


def load_policy(path: Path) -> GatePolicy:
    return cfgio.load(PolicyFile, path, ()).gate


@dataclass(frozen=True)
class FloorMargin:
    metric: str
    cpu: str
    dtype: str
    value: float
    stderr: float
    bound: float  # the rule's min or max
    margin_se: float  # how far on the passing side of the bound, in standard errors (negative: failing)


def floor_margins(policy: GatePolicy, measurements: list[Measurement] | None = None) -> list[FloorMargin]:
    """For every rule with a floor or ceiling and every measurement (default: the policy's own ``measured``): the
    distance of the measured value from the bound, in its standard errors, positive on the passing side. A
    measurement lacking a ruled metric raises: a floor without evidence is not a calibrated floor."""
    out = []
    for m in policy.measured if measurements is None else measurements:
        for name, rule in policy.rules.items():
            bound = rule.min if rule.min is not None else rule.max
            if bound is None:
                continue
            if name not in m.metrics:
                raise ConfigError(f"gate policy {policy.name}: the {m.cpu} {m.dtype} measurement lacks {name}")
            value, stderr = m.metrics[name]
            gap = value - bound if rule.min is not None else bound - value
            out.append(FloorMargin(name, m.cpu, m.dtype, value, stderr, bound, gap / stderr))
    return out


@dataclass(frozen=True)
class MetricVerdict:
    metric: str
    higher_is_better: bool | None
    value: float | None
    verdict: Verdict
    reason: str
    floor: float | None = None  # the min or max of the rule
    champion_value: float | None = None
    delta: float | None = None  # candidate - champion on the shared items (raw units)
    ci_low: float | None = None  # bounds of the improvement (positive = better)
    ci_high: float | None = None
    tolerance: float | None = None
    n_paired: int | None = None


@dataclass(frozen=True)
class GateDecision:
    model: str
    passed: bool
    policy: str
    policy_hash: str
    eval_sets: str
    champion: str | None
    verdicts: list[MetricVerdict] = field(default_factory=list)

    @property
    def failing(self) -> list[str]:
        return [v.metric for v in self.verdicts if v.verdict == "fail"]

    @property
    def summary(self) -> str:
        if self.passed:
            return f"passed {len(self.verdicts)} rules" + (f" vs champion {self.champion}" if self.champion else "")
        return "failed: " + "; ".join(f"{v.metric} {v.reason}" for v in self.verdicts if v.verdict == "fail")

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "failing": self.failing, "summary": self.summary}


def paired_bootstrap(
    cand: MetricResult, champ: MetricResult, keys: list[str], spec: BootstrapSpec
) -> tuple[float, float, float]:
    """(improvement, ci_low, ci_high) of candidate over champion on ``keys``, positive = better, resampling
    items jointly; weighted metrics (bits per byte) are recomputed as weighted means in every resample."""
    sign = 1.0 if cand.higher_is_better else -1.0
    a = np.array([cand.items[k] for k in keys])
    b = np.array([champ.items[k] for k in keys])
    w = np.array([(cand.weights or {}).get(k, 1.0) for k in keys]) if cand.weights else np.ones(len(keys))
    point = sign * (float(np.sum(a * w) - np.sum(b * w)) / float(np.sum(w)))
    rng = np.random.default_rng(spec.seed)
    idx = rng.integers(0, len(keys), size=(spec.samples, len(keys)))
    ws = w[idx]
    diffs = sign * (np.sum(a[idx] * ws, axis=1) - np.sum(b[idx] * ws, axis=1)) / np.sum(ws, axis=1)
    alpha = (1 - spec.confidence) / 2
    low, high = np.quantile(diffs, [alpha, 1 - alpha])
    return point, float(low), float(high)


def _floor(rule: Rule, m: MetricResult) -> tuple[bool, str, float | None]:
    if rule.min is not None:
        if not m.higher_is_better:
            raise ConfigError(f"gate policy: {m.name} is lower-is-better; give it 'max', not 'min'")
        return m.value >= rule.min, f"{m.value:.3f} {'>=' if m.value >= rule.min else '<'} min {rule.min:g}", rule.min
    if rule.max is not None:
        if m.higher_is_better:
            raise ConfigError(f"gate policy: {m.name} is higher-is-better; give it 'min', not 'max'")
        return m.value <= rule.max, f"{m.value:.3f} {'<=' if m.value <= rule.max else '>'} max {rule.max:g}", rule.max
    return True, f"{m.value:.3f} (no floor)", None


def _judge(
    name: str, rule: Rule, m: MetricResult | None, champ: EvalReport | None, policy: GatePolicy, same_items: bool
) -> MetricVerdict:
    """Floor first, then (when there is a champion and a tolerance) the paired comparison; both are reported
    even when the floor already failed, so a reader sees how far off the champion the candidate is."""
    if m is None:
        return MetricVerdict(name, None, None, "fail", "not measured (the suite did not report it)")
    ok, floor_reason, floor = _floor(rule, m)
    verdict = MetricVerdict(
        name, m.higher_is_better, m.value, "pass", floor_reason, floor=floor, tolerance=rule.tolerance
    )
    reasons = [floor_reason + ("" if ok else " (floor)")]
    failed = not ok
    if champ is not None and rule.tolerance is not None:
        cm = champ.metrics().get(name)
        keys = sorted(set(m.items) & set(cm.items)) if cm is not None and same_items else []
        if not same_items:
            failed = True
            reasons.append(
                f"champion {champ.model} was evaluated on other items (eval sets {champ.eval_sets[:12]}); "
                "re-evaluate it on this set"
            )
        elif cm is None or not keys:
            failed = True
            reasons.append(f"champion {champ.model} has no per-item {name}")
        else:
            point, low, high = paired_bootstrap(m, cm, keys, policy.bootstrap)
            cand_v, champ_v = weighted_value(m.items, m.weights, keys), weighted_value(cm.items, cm.weights, keys)
            verdict = replace(
                verdict, champion_value=cm.value, delta=cand_v - champ_v, ci_low=low, ci_high=high, n_paired=len(keys)
            )
            ci = f"improvement {point:+.3f}, {policy.bootstrap.confidence:.0%} CI [{low:+.3f}, {high:+.3f}]"
            if high < -rule.tolerance:
                failed = True
                reasons.append(f"regressed vs {champ.model}: {ci} is below -{rule.tolerance:g}")
            else:
                noise = " (within noise)" if point < -rule.tolerance else ""
                reasons.append(f"vs {champ.model}: {ci}{noise}")
    return replace(verdict, verdict="fail" if failed else "pass", reason="; ".join(reasons))


def decide(report: EvalReport, champion: EvalReport | None, policy: GatePolicy) -> GateDecision:
    """The gate decision for ``report`` (see the module docstring); no I/O, deterministic."""
    metrics: Mapping[str, MetricResult] = report.metrics()
    same_items = champion is not None and champion.eval_sets == report.eval_sets
    verdicts = [
        _judge(name, rule, metrics.get(name), champion, policy, same_items) for name, rule in policy.rules.items()
    ]
    return GateDecision(
        model=report.model,
        passed=all(v.verdict == "pass" for v in verdicts),
        policy=policy.name,
        policy_hash=policy.config_hash(),
        eval_sets=report.eval_sets,
        champion=champion.model if champion else None,
        verdicts=verdicts,
    )


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


def _served_lines(report: EvalReport) -> list[str]:
    """What the endpoint's filters did, for a report judged as served (``evals.as_served``)."""
    if report.served is None:
        return []
    counts = report.served.suites.items()
    did = ", ".join(f"{name} {c['blocked']} of {c['asked']} blocked, {c['stopped']} stopped" for name, c in counts)
    return [f"- judged as the endpoint serves it: {report.served.filters}", f"- the filters: {did or 'nothing asked'}"]


def render_markdown(decision: GateDecision, report: EvalReport) -> str:
    """The decision as Markdown (MLflow artifact, Prefect artifact, CLI)."""
    head = "PASSED" if decision.passed else "FAILED"
    lines = [
        f"# Gate {head}: {decision.model}",
        "",
        f"- policy `{decision.policy}` ({decision.policy_hash[:12]}), champion "
        f"{'`' + decision.champion + '`' if decision.champion else 'none (floors only)'}",
        f"- eval sets `{decision.eval_sets[:16]}`, snapshot `{report.snapshot[:12]}`, seed {report.seed}",
        f"- {decision.summary}",
        *_served_lines(report),
        "",
        "| metric | dir | value | floor | champion | Δ | CI of improvement | verdict | reason |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for v in decision.verdicts:
        direction = "-" if v.higher_is_better is None else ("↑" if v.higher_is_better else "↓")
        ci = "-" if v.ci_low is None else f"[{v.ci_low:+.3f}, {v.ci_high:+.3f}]"
        delta = "-" if v.delta is None else f"{v.delta:+.3f}"
        mark = "✅" if v.verdict == "pass" else "❌"
        lines.append(
            f"| {v.metric} | {direction} | {_fmt(v.value)} | {_fmt(v.floor)} | {_fmt(v.champion_value)} | {delta} "
            f"| {ci} | {mark} {v.verdict} | {v.reason} |"
        )
    lines += ["", "## All metrics", "", "| metric | value | ± stderr | n | seconds (suite) |", "|---|---|---|---|---|"]
    for suite in report.suites:
        for m in suite.metrics:
            err = "-" if m.stderr is None else f"{m.stderr:.3f}"
            lines.append(f"| {m.name} | {m.value:.3f} | {err} | {m.n} | {suite.seconds:.1f} |")
    return "\n".join(lines) + "\n"
