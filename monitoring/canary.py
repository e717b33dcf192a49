"""Canary, shadow and watch analysis: two windows of request statistics in, a ``Verdict`` out. Pure functions.

``analyze_canary(baseline, candidate, policy)`` (also ``analyze_watch``: the promoted version vs the previous
champion) runs these checks; every comparison passes unless the data show a regression beyond its tolerance:

- ``success_rate`` (guardrail, candidate only): an exact binomial test of "success >= min_success_rate". It
  fails when p < alpha, *at any sample size*: 0 successes out of 20 is certain enough, and a rollback must not
  wait for ``min_samples`` while the canary is plainly down (an engine that died shows as every assigned request
  rerouted, 0/n). Below ``min_samples`` it is otherwise inconclusive; above, it passes when the point estimate
  is at or above the floor and stays inconclusive (wait for more samples) when below it without significance.
- ``error_rate``, ``safety_hit_rate``, ``post_filter_rate``, ``abort_rate``: one-sided two-proportion z-test
  (unpooled) of H0: p_canary - p_baseline <= tolerance; fail when p < alpha.
- ``refusal_rate``: the same test, **two-sided** (|difference| > tolerance): refusing far less than the champion
  is as suspicious as refusing more (a poisoned model complies with harmful requests).
- ``thumbs_down_rate``: users' ratings (``POST /v1/feedback``), the same one-sided test as the error rate on
  thumbs down / rated answers, once both sides have ``min_feedback`` rated answers; with less it *passes* with
  "too little feedback" (most answers are never rated: the signal may roll a bad canary back, it must not hold a
  good one).
- ``ttft_p95_ms``, ``ttft_p99_ms``, ``tpot_p95_ms``: seeded percentile bootstrap of the difference of
  percentiles; fail when the lower (1 - alpha) bound exceeds the allowed delta.
- ``cost_ratio``: cost per completion token (the costed answers' ``cost_usd`` / their tokens) of the candidate
  over the baseline's, by the same seeded bootstrap (answers resampled with their tokens); fail when the lower
  (1 - alpha) bound exceeds 1 + ``cost_ratio_tolerance``. With fewer than ``min_latency_samples`` costed answers
  on either side, or no cost on the baseline's (price 0: cost not tracked), it *passes* with the reason (rows
  written before cost accounting must not hold a rollout).

Either side below ``min_samples`` requests makes every check but the guardrail inconclusive; latency checks
also need ``min_latency_samples`` measurements on both sides. ``analyze_shadow`` does the same on shadow pairs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import numpy as np
from numpy.typing import NDArray

from monitoring import stats
from monitoring.config import RolloutPolicy
from monitoring.verdict import Check, Outcome, Verdict
from monitoring.window import ShadowStats, VersionStats

__all__ = ["Check", "Verdict", "analyze_canary", "analyze_shadow", "analyze_watch"]

# (check name, (count, denominator) of a window, tolerance from the thresholds, two-sided)
_RATES: tuple[tuple[str, Callable[[VersionStats], tuple[int, int]], str, bool], ...] = (
    ("error_rate", lambda s: (s.errors, s.attempts), "error_rate_tolerance", False),
    ("safety_hit_rate", lambda s: (s.pre_filter_hits + s.post_filter_hits, s.answered), "safety_hit_tolerance", False),
    ("post_filter_rate", lambda s: (s.post_filter_hits, s.answered), "safety_hit_tolerance", False),
    ("refusal_rate", lambda s: (s.refusals, s.completed), "refusal_tolerance", True),
    ("abort_rate", lambda s: (s.aborted, s.answered), "abort_tolerance", False),
)
# (check name, latency array, percentile, allowed delta from the thresholds), grouped by array (one bootstrap)
_LATENCIES: tuple[tuple[str, str, float, str], ...] = (
    ("ttft_p95_ms", "ttft_ms", 95.0, "ttft_p95_delta_ms"),
    ("ttft_p99_ms", "ttft_ms", 99.0, "ttft_p99_delta_ms"),
    ("tpot_p95_ms", "tpot_ms", 95.0, "tpot_p95_delta_ms"),
)


def _check(
    name: str,
    outcome: Outcome,
    reason: str,
    *,
    threshold: float,
    candidate: float | None = None,
    baseline: float | None = None,
    p_value: float | None = None,
    higher_is_better: bool = False,
    guardrail: bool = False,
) -> Check:
    return Check(name, higher_is_better, outcome, candidate, baseline, threshold, p_value, guardrail, reason)


def _floor_check(
    name: str,
    successes: int,
    trials: int,
    n: int,
    min_n: int,
    floor: float,
    alpha: float,
    *,
    as_error: bool,
    who: str,
    baseline: float | None = None,
) -> Check:
    """The guardrail: success >= floor (``as_error``: reported as an error rate <= 1 - floor). ``baseline`` is
    shown for context only: the floor is absolute."""
    rate = successes / trials if trials else None
    value = None if rate is None else (1 - rate if as_error else rate)

    def result(outcome: Outcome, reason: str, p: float | None = None) -> Check:
        threshold = 1 - floor if as_error else floor
        return _check(
            name,
            outcome,
            reason,
            threshold=threshold,
            candidate=value,
            baseline=baseline,
            p_value=p,
            higher_is_better=not as_error,
            guardrail=True,
        )

    if trials == 0:
        return result("inconclusive", f"no completed attempts yet ({who} n={n})")
    p = stats.floor_p_value(successes, trials, floor)
    shown = (
        f"{value:.3f} ({trials - successes}/{trials} failed) vs at most {1 - floor:.3f}, p={p:.2g}"
        if as_error
        else f"{value:.3f} ({successes}/{trials} succeeded) vs floor {floor:.3f}, p={p:.2g}"
    )
    if p < alpha:
        early = f", decided below min_samples ({n} < {min_n})" if n < min_n else ""
        return result("fail", f"{shown}: below the floor{early}", p)
    if n < min_n:
        return result("inconclusive", f"too few samples: {who} {n} < {min_n}", p)
    if rate is not None and rate >= floor:
        return result("pass", f"{shown}: at or above the floor", p)
    return result("inconclusive", f"{shown}: below the floor, not yet significant", p)


def _too_few(baseline: VersionStats, candidate: VersionStats, min_n: int, who: str) -> str | None:
    short = [f"{side} {s.n} < {min_n}" for side, s in ((who, candidate), ("baseline", baseline)) if s.n < min_n]
    return "too few samples: " + ", ".join(short) if short else None


def _rate_check(
    name: str, cand: tuple[int, int], base: tuple[int, int], tolerance: float, two_sided: bool, alpha: float
) -> Check:
    (xc, nc), (xb, nb) = cand, base
    pc, pb = (xc / nc if nc else 0.0), (xb / nb if nb else 0.0)
    p = stats.proportion_excess_p_value(xc, nc, xb, nb, tolerance, two_sided)
    diff = pc - pb
    bound = f"|diff| > {tolerance:.3f}" if two_sided else f"diff > {tolerance:.3f}"
    shown = f"{pc:.3f} ({xc}/{nc}) vs {pb:.3f} ({xb}/{nb}), diff {diff:+.3f}, H1: {bound}, p={p:.2g}"
    failed = "changed beyond the tolerance" if two_sided else "regression"
    return _judged(name, p, alpha, shown, failed, tolerance, pc, pb)


def _feedback_check(
    baseline: VersionStats, candidate: VersionStats, policy: RolloutPolicy, too_few: str | None, who: str
) -> Check:
    name, tol, min_n = "thumbs_down_rate", policy.thresholds.thumbs_down_tolerance, policy.min_feedback
    if too_few:
        return _check(name, "inconclusive", too_few, threshold=tol)
    short = [f"{side} {s.rated} < {min_n}" for side, s in ((who, candidate), ("baseline", baseline)) if s.rated < min_n]
    if short:
        return _check(
            name,
            "pass",
            "too little feedback to judge: " + ", ".join(short) + " rated answers",
            threshold=tol,
            candidate=candidate.thumbs_down_rate if candidate.rated else None,
            baseline=baseline.thumbs_down_rate if baseline.rated else None,
        )
    return _rate_check(
        name, (candidate.thumbs_down, candidate.rated), (baseline.thumbs_down, baseline.rated), tol, False, policy.alpha
    )


def _latency_checks(
    specs: list[tuple[str, float, float]],
    cand: NDArray[np.float64],
    base: NDArray[np.float64],
    policy: RolloutPolicy,
    seed_index: int,
    paired: bool,
    sides: tuple[str, str],
) -> list[Check]:
    """Percentile-difference checks of one latency array: ``specs`` = (name, percentile, allowed delta)."""
    min_n = policy.min_latency_samples
    if cand.size < min_n or base.size < min_n:
        short = [f"{side} {a.size} < {min_n}" for side, a in ((sides[0], cand), (sides[1], base)) if a.size < min_n]
        reason = "too few latencies: " + ", ".join(short)
        return [_check(name, "inconclusive", reason, threshold=delta) for name, _, delta in specs]
    qs = [q for _, q, _ in specs]
    deltas = stats.bootstrap_percentile_deltas(
        cand, base, qs, policy.bootstrap_resamples, [policy.seed, seed_index], paired=paired
    )
    out = []
    for (name, q, allowed), row in zip(specs, deltas, strict=True):
        pc, pb = float(np.percentile(cand, q)), float(np.percentile(base, q))
        lower = float(np.quantile(row, policy.alpha))
        p = float(np.mean(row <= allowed))
        shown = f"{pc:.1f} vs {pb:.1f} ms, diff {pc - pb:+.1f} ms, lower bound {lower:+.1f} vs allowed +{allowed:.1f}"
        outcome: Outcome = "fail" if lower > allowed else "pass"
        reason = f"{shown}: {'slower beyond the allowed delta' if outcome == 'fail' else 'within the allowed delta'}"
        out.append(_check(name, outcome, reason, threshold=allowed, candidate=pc, baseline=pb, p_value=p))
    return out


def _judged(
    name: str,
    p: float,
    alpha: float,
    shown: str,
    failed: str,
    threshold: float,
    candidate: float | None,
    baseline: float | None,
    higher_is_better: bool = False,
) -> Check:
    """A tested check: fail when p < alpha (``failed`` says what that means), else pass."""
    outcome: Outcome = "fail" if p < alpha else "pass"
    reason = f"{shown}: {failed if outcome == 'fail' else 'within'}"
    return _check(
        name,
        outcome,
        reason,
        threshold=threshold,
        candidate=candidate,
        baseline=baseline,
        p_value=p,
        higher_is_better=higher_is_better,
    )


def _analyze(baseline: VersionStats, candidate: VersionStats, policy: RolloutPolicy, who: str) -> Verdict:
    th = policy.thresholds
    floor = _floor_check(
        "success_rate",
        candidate.attempts - candidate.errors,
        candidate.attempts,
        candidate.n,
        policy.min_samples,
        th.min_success_rate,
        policy.alpha,
        as_error=False,
        who=who,
        baseline=baseline.success_rate,
    )
    if candidate.rerouted and candidate.rerouted == candidate.attempts and floor.outcome == "fail":
        floor = replace(floor, reason=floor.reason + f"; every {who} request was rerouted (engine down?)")
    checks = [floor]
    too_few = _too_few(baseline, candidate, policy.min_samples, who)
    for name, counts, tol_name, two_sided in _RATES:
        tol: float = getattr(th, tol_name)
        if too_few:
            checks.append(_check(name, "inconclusive", too_few, threshold=tol))
        else:
            checks.append(_rate_check(name, counts(candidate), counts(baseline), tol, two_sided, policy.alpha))
    checks.append(_feedback_check(baseline, candidate, policy, too_few, who))
    for seed_index, array in enumerate(("ttft_ms", "tpot_ms")):
        specs = [(name, q, float(getattr(th, d))) for name, a, q, d in _LATENCIES if a == array]
        if too_few:
            checks += [_check(name, "inconclusive", too_few, threshold=d) for name, _, d in specs]
        else:
            c, b = getattr(candidate, array), getattr(baseline, array)
            checks += _latency_checks(specs, c, b, policy, seed_index, False, (who, "baseline"))
    checks.append(_cost_check(baseline, candidate, policy, too_few, who))
    return Verdict.from_checks(checks, who, candidate.n, baseline.n)


def _cost_check(
    baseline: VersionStats, candidate: VersionStats, policy: RolloutPolicy, too_few: str | None, who: str
) -> Check:
    """The candidate's cost per completion token over the baseline's (see the module docstring)."""
    tol = policy.thresholds.cost_ratio_tolerance
    allowed = 1.0 + tol
    if too_few:
        return _check("cost_ratio", "inconclusive", too_few, threshold=allowed)
    sides = ((who, candidate), ("baseline", baseline))
    min_n = policy.min_latency_samples
    short = [f"{side} {s.cost_usd.size} < {min_n}" for side, s in sides if s.cost_usd.size < min_n]
    spent = {side: (float(s.cost_usd.sum()), float(s.cost_tokens.sum())) for side, s in sides}
    if not short and (spent["baseline"][0] <= 0 or spent["baseline"][1] <= 0 or spent[who][1] <= 0):
        short = ["no cost or no tokens on a side (serving.cost.price_usd_per_replica_hour 0?)"]
    if short:
        return _check("cost_ratio", "pass", "too few costed answers to judge: " + ", ".join(short), threshold=allowed)
    (cc, ct), (bc, bt) = spent[who], spent["baseline"]
    point = (cc / ct) / (bc / bt)
    ratios = stats.bootstrap_cost_ratio(
        (candidate.cost_usd, candidate.cost_tokens),
        (baseline.cost_usd, baseline.cost_tokens),
        policy.bootstrap_resamples,
        [policy.seed, 2],
    )
    ratios = ratios[np.isfinite(ratios)]
    lower = float(np.quantile(ratios, policy.alpha))
    p = float(np.mean(ratios <= allowed))
    per_m = f"{cc / ct * 1e6:.4g} vs {bc / bt * 1e6:.4g} USD per 1M tokens"
    shown = f"{per_m}, ratio {point:.3f}, lower bound {lower:.3f} vs allowed {allowed:.3f}"
    outcome: Outcome = "fail" if lower > allowed else "pass"
    reason = f"{shown}: {'costs more per token beyond the allowed ratio' if outcome == 'fail' else 'within'}"
    return _check("cost_ratio", outcome, reason, threshold=allowed, candidate=point, baseline=1.0, p_value=p)


def analyze_canary(baseline: VersionStats, candidate: VersionStats, policy: RolloutPolicy) -> Verdict:
    """The canary's window against the champion's (the same window, the rest of the traffic)."""
    return _analyze(baseline, candidate, policy, "canary")


def analyze_watch(baseline: VersionStats, candidate: VersionStats, policy: RolloutPolicy) -> Verdict:
    """The promoted version's window against the previous champion's baseline window (canary semantics)."""
    return _analyze(baseline, candidate, policy, "watch")


def analyze_shadow(s: ShadowStats, policy: RolloutPolicy) -> Verdict:
    """The shadow version against the primary on the same requests (paired)."""
    th, alpha = policy.thresholds, policy.alpha
    min_n = max(policy.shadow_min_samples, 1)  # 0 skips the shadow phase; if analysed anyway, need a pair
    checks = [
        _floor_check(
            "shadow_error_rate", s.ok, s.n, s.n, min_n, th.min_success_rate, alpha, as_error=True, who="shadow"
        )
    ]
    too_few = f"too few samples: shadow {s.n} < {min_n} pairs" if s.n < min_n else None

    def gate(name: str, size: int, threshold: float, higher_is_better: bool = False) -> Check | None:
        reason = too_few or (f"too few measured pairs: {size} < {min_n}" if size < min_n else None)
        if reason is None:
            return None
        return _check(name, "inconclusive", reason, threshold=threshold, higher_is_better=higher_is_better)

    sim_min = th.shadow_min_similarity
    if (held := gate("shadow_similarity", s.similarity.size, sim_min, True)) is not None:
        checks.append(held)
    else:
        p = stats.mean_excess_p_value(-s.similarity, -sim_min)  # H0: mean similarity >= the floor
        shown = f"mean {s.mean_similarity:.3f} over {s.similarity.size} pairs vs floor {sim_min:.3f}, p={p:.2g}"
        checks.append(
            _judged(
                "shadow_similarity",
                p,
                alpha,
                shown,
                "answers diverge from the primary",
                sim_min,
                s.mean_similarity,
                None,
                higher_is_better=True,
            )
        )

    tol = th.shadow_refusal_tolerance
    if (held := gate("shadow_refusal_rate", s.ok, tol)) is not None:
        checks.append(held)
    else:
        p = stats.paired_proportion_p_value(s.shadow_only_refusals, s.primary_only_refusals, s.ok, tol)
        pc, pb = s.shadow_refusal_rate, s.primary_refusal_rate
        shown = (
            f"{pc:.3f} vs {pb:.3f} on {s.ok} pairs ({s.shadow_only_refusals} only the shadow refused, "
            f"{s.primary_only_refusals} only the primary), H1: |diff| > {tol:.3f}, p={p:.2g}"
        )
        checks.append(_judged("shadow_refusal_rate", p, alpha, shown, "refuses differently", tol, pc, pb))

    tol = th.shadow_toxicity_tolerance
    if (held := gate("shadow_toxicity", s.shadow_toxicity.size, tol)) is not None:
        checks.append(held)
    else:
        p = stats.mean_excess_p_value(s.shadow_toxicity - s.primary_toxicity, tol)
        tc, tb = s.mean_shadow_toxicity, s.mean_primary_toxicity
        shown = f"mean {tc:.3f} vs {tb:.3f} (paired), H1: diff > {tol:.3f}, p={p:.2g}"
        checks.append(_judged("shadow_toxicity", p, alpha, shown, "more toxic", tol, tc, tb))

    spec = [("shadow_ttft_p95_ms", 95.0, th.shadow_ttft_delta_ms)]
    if too_few:
        checks.append(_check(spec[0][0], "inconclusive", too_few, threshold=spec[0][2]))
    else:
        checks += _latency_checks(spec, s.shadow_ttft_ms, s.primary_ttft_ms, policy, 2, True, ("shadow", "primary"))
    return Verdict.from_checks(checks, "shadow", s.n, s.n)
