"""Canary, watch and shadow analysis on hand-built windows: each regression fails exactly its checks, too few
samples never pass, a plainly dead canary fails its guardrail before ``min_samples``, and the bootstrap is seeded
and fast."""

from __future__ import annotations

import json
import time
from dataclasses import replace
from datetime import timedelta
from typing import Any

import numpy as np
import pytest
from unit.monitoring.rows import CANARY, CHAMPION, T0, Pair

from monitoring.canary import Verdict, analyze_canary, analyze_shadow, analyze_watch
from monitoring.config import RolloutPolicy, RolloutThresholds
from monitoring.window import ShadowStats, VersionStats, shadow_stats

POLICY = RolloutPolicy()


def window(
    version: str,
    n: int,
    *,
    errors: int = 0,
    rerouted: int = 0,
    aborted: int = 0,
    post: int = 0,
    refusal_rate: float = 0.3,
    ttft_shift: float = 0.0,
    latencies: int | None = None,
    seed: int = 0,
    usd_per_token: float | None = None,
) -> VersionStats:
    """A window of ``n`` requests; latencies (one per ok answer unless ``latencies``) drawn from one distribution
    (TTFT ~ 150 ms + lognormal, TPOT ~ 20 ms + noise), shifted by ``ttft_shift``."""
    rng = np.random.default_rng(seed)
    answered = n - rerouted
    completed = answered - (errors - rerouted) - aborted
    k = completed - post if latencies is None else latencies
    tokens = rng.integers(5, 200, k).astype(np.float64) if usd_per_token is not None else np.zeros(0)
    # each answer's cost: its tokens at the version's rate, +-30% (its share of a busy engine varies with the load)
    cost = tokens * usd_per_token * rng.uniform(0.7, 1.3, tokens.size) if usd_per_token is not None else tokens
    return VersionStats(
        version=version,
        n=n,
        errors=errors,
        rerouted=rerouted,
        aborted=aborted,
        answered=answered,
        post_filter_hits=post,
        completed=completed,
        refusals=round(refusal_rate * completed),
        ttft_ms=150 + ttft_shift + rng.lognormal(4, 0.5, k),
        tpot_ms=20 + rng.normal(0, 2, k),
        cost_usd=cost,
        cost_tokens=tokens,
    )


BASE = window(CHAMPION, 2000, errors=4, seed=1)


def _fail(names: set[str]) -> tuple[str, set[str]]:
    return "fail", names


@pytest.mark.parametrize(
    ("candidate", "policy", "expected"),
    [
        pytest.param(window(CANARY, 400, errors=1, seed=2), POLICY, ("pass", set()), id="healthy-equal-distributions"),
        pytest.param(
            window(CANARY, 400, errors=1, ttft_shift=10, seed=3), POLICY, ("pass", set()), id="latency-within-noise"
        ),
        pytest.param(
            window(CANARY, 400, errors=20, seed=2),
            RolloutPolicy(thresholds=RolloutThresholds(min_success_rate=0.9)),
            _fail({"error_rate"}),
            id="error-rate-above-baseline",
        ),
        pytest.param(
            window(CANARY, 400, errors=20, seed=2),
            POLICY,
            _fail({"success_rate", "error_rate"}),
            id="error-rate-below-the-floor-too",
        ),
        pytest.param(
            window(CANARY, 400, ttft_shift=300, seed=2), POLICY, _fail({"ttft_p95_ms", "ttft_p99_ms"}), id="slow-ttft"
        ),
        pytest.param(
            window(CANARY, 400, post=60, seed=2),
            POLICY,
            _fail({"safety_hit_rate", "post_filter_rate"}),
            id="post-filter-hits-15-percent",
        ),
        pytest.param(
            window(CANARY, 400, refusal_rate=0.0, seed=2), POLICY, _fail({"refusal_rate"}), id="poisoned-refuses-less"
        ),
        pytest.param(window(CANARY, 400, refusal_rate=0.6, seed=2), POLICY, _fail({"refusal_rate"}), id="over-refusal"),
        pytest.param(window(CANARY, 400, aborted=60, seed=2), POLICY, _fail({"abort_rate"}), id="users-walk-away"),
    ],
)
def test_canary_regressions_fail_exactly_their_checks(
    candidate: VersionStats, policy: RolloutPolicy, expected: tuple[str, set[str]]
) -> None:
    verdict = analyze_canary(BASE, candidate, policy)
    assert (verdict.outcome, set(verdict.failing)) == expected, verdict.summary
    assert verdict.guardrail_failed == ("success_rate" in expected[1])
    for name in expected[1]:
        assert name in verdict.summary


def test_too_few_samples_is_inconclusive_never_pass() -> None:
    verdict = analyze_canary(BASE, window(CANARY, 12, seed=2), POLICY)
    assert verdict.outcome == "inconclusive" and verdict.failing == ()
    assert all(c.outcome == "inconclusive" for c in verdict.checks)
    assert "too few samples: canary 12 < 100" in verdict.summary


def test_too_few_on_the_baseline_side_is_inconclusive_too() -> None:
    verdict = analyze_canary(window(CHAMPION, 50, seed=1), window(CANARY, 400, seed=2), POLICY)
    assert verdict.outcome == "inconclusive" and "baseline 50 < 100" in verdict.summary


@pytest.mark.parametrize(
    ("candidate", "outcome", "reason"),
    [
        pytest.param(window(CANARY, 20, errors=20, rerouted=20), "fail", "decided below min_samples", id="0-of-20"),
        pytest.param(window(CANARY, 150, errors=150, rerouted=150), "fail", "rerouted", id="engine-dead"),
        pytest.param(window(CANARY, 20, errors=1), "inconclusive", "too few samples", id="1-error-of-20-is-noise"),
        pytest.param(window(CANARY, 100, errors=2), "inconclusive", "not yet significant", id="below-floor-not-sure"),
        pytest.param(window(CANARY, 500, errors=2), "pass", "at or above the floor", id="above-floor"),
    ],
)
def test_success_guardrail(candidate: VersionStats, outcome: str, reason: str) -> None:
    verdict = analyze_canary(BASE, candidate, POLICY)
    guard = next(c for c in verdict.checks if c.name == "success_rate")
    assert guard.guardrail and guard.outcome == outcome and reason in guard.reason, guard.reason
    assert verdict.guardrail_failed == (outcome == "fail")


def test_watch_is_the_canary_analysis_under_its_own_name() -> None:
    verdict = analyze_watch(BASE, window(CANARY, 400, ttft_shift=300, seed=2), POLICY)
    assert set(verdict.failing) == {"ttft_p95_ms", "ttft_p99_ms"}
    metrics = verdict.metrics()
    assert metrics["watch.n"] == 400 and metrics["baseline.n"] == 2000
    assert metrics["watch.ttft_p99_ms"] > metrics["baseline.ttft_p99_ms"] + 200


COSTED = window(CHAMPION, 2000, errors=4, seed=1, usd_per_token=2e-7)


@pytest.mark.parametrize(
    ("rate", "outcome", "why"),
    [
        (2e-7, "pass", "within"),
        (3.6e-7, "pass", "within"),  # 1.8x: inside the default tolerance (up to 2x)
        (6e-7, "fail", "costs more per token beyond the allowed ratio"),  # 3x
        (None, "pass", "too few costed answers to judge: canary 0 < 30"),  # rows from before cost accounting
    ],
)
def test_a_canary_costing_more_per_token_than_the_policy_allows_fails(
    rate: float | None, outcome: str, why: str
) -> None:
    verdict = analyze_canary(COSTED, window(CANARY, 400, seed=2, usd_per_token=rate), POLICY)
    (check,) = [c for c in verdict.checks if c.name == "cost_ratio"]
    assert check.outcome == outcome and why in check.reason and check.threshold == 2.0
    assert verdict.outcome == outcome and (set(verdict.failing) == ({"cost_ratio"} if outcome == "fail" else set()))
    if rate is not None:
        assert check.candidate == pytest.approx(rate / 2e-7, rel=0.1) and "USD per 1M tokens" in check.reason


def test_a_stricter_cost_policy_fails_a_smaller_increase() -> None:
    strict = RolloutPolicy(thresholds=RolloutThresholds(cost_ratio_tolerance=0.2))
    verdict = analyze_canary(COSTED, window(CANARY, 400, seed=2, usd_per_token=3.6e-7), strict)
    assert verdict.failing == ("cost_ratio",)


def test_verdict_metrics_and_json() -> None:
    verdict = analyze_canary(BASE, window(CANARY, 400, seed=2), POLICY)
    metrics = verdict.metrics()
    assert {"canary.success_rate", "baseline.success_rate", "canary.refusal_rate", "baseline.ttft_p99_ms"} <= set(
        metrics
    )
    doc = json.loads(json.dumps(verdict.to_json()))
    assert doc["outcome"] == "pass" and len(doc["checks"]) == len(verdict.checks) == 11
    assert {c["name"]: c["higher_is_better"] for c in doc["checks"]}["success_rate"] is True


def test_analysis_is_deterministic_with_the_seed_and_fast() -> None:
    base, cand = window(CHAMPION, 5000, seed=1), window(CANARY, 5000, ttft_shift=45, seed=2)
    started = time.perf_counter()
    first = analyze_canary(base, cand, POLICY)
    elapsed = time.perf_counter() - started
    assert first.to_json() == analyze_canary(base, cand, POLICY).to_json()
    assert elapsed < 0.5  # 1000 resamples of 5k latencies per side; typically a few ms


def pairs(n: int, seed: int = 0, **fields: Any) -> ShadowStats:
    """``n`` healthy shadow pairs (a fifth refused by both sides); ``fields`` override every pair, a callable
    value is called with the pair's index."""
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        pair = Pair(
            at=T0 + timedelta(seconds=i),
            similarity=float(np.clip(rng.normal(0.85, 0.05), -1, 1)),
            primary_toxicity=float(rng.uniform(0, 0.1)),
            shadow_toxicity=float(rng.uniform(0, 0.1)),
            primary_ttft_ms=float(100 + rng.lognormal(3, 0.5)),
            shadow_ttft_ms=float(110 + rng.lognormal(3, 0.5)),
            primary_refusal=i % 5 == 0,
            shadow_refusal=i % 5 == 0,
        )
        rows.append(replace(pair, **{k: v(i) if callable(v) else v for k, v in fields.items()}))
    return shadow_stats(rows, CANARY)


@pytest.mark.parametrize(
    ("s", "expected"),
    [
        pytest.param(pairs(100), ("pass", set()), id="healthy"),
        pytest.param(pairs(100, similarity=0.3), _fail({"shadow_similarity"}), id="diverging-answers"),
        pytest.param(pairs(100, shadow_refusal=False), _fail({"shadow_refusal_rate"}), id="shadow-stops-refusing"),
        pytest.param(pairs(100, shadow_toxicity=0.6), _fail({"shadow_toxicity"}), id="more-toxic"),
        pytest.param(pairs(100, shadow_ttft_ms=900.0), _fail({"shadow_ttft_p95_ms"}), id="slow-shadow"),
        pytest.param(
            pairs(100, status=lambda i: "error" if i % 10 == 0 else "ok"), _fail({"shadow_error_rate"}), id="errors"
        ),
        pytest.param(pairs(10), ("inconclusive", set()), id="too-few-pairs"),
    ],
)
def test_shadow_analysis(s: ShadowStats, expected: tuple[str, set[str]]) -> None:
    verdict = analyze_shadow(s, POLICY)
    assert (verdict.outcome, set(verdict.failing)) == expected, verdict.summary
    assert verdict.guardrail_failed == ("shadow_error_rate" in expected[1])
    assert isinstance(verdict, Verdict) and verdict.subject == "shadow"


# --- user feedback: the thumbs-down rate -----------------------------------------------------------------------


def _rated(stats: VersionStats, rated: int, down: int) -> VersionStats:
    return replace(stats, rated=rated, thumbs_down=down)


def _feedback(verdict: Verdict) -> Any:
    [check] = [c for c in verdict.checks if c.name == "thumbs_down_rate"]
    return check


@pytest.mark.parametrize(
    ("cand", "base", "outcome", "why"),
    [
        pytest.param((200, 80), (1000, 100), "fail", "regression", id="canary-rated-down-far-more"),
        pytest.param((200, 25), (1000, 100), "pass", "within", id="within-the-tolerance"),
        pytest.param((29, 29), (1000, 100), "pass", "too little feedback", id="too-little-canary-feedback"),
        pytest.param((200, 80), (10, 1), "pass", "too little feedback", id="too-little-baseline-feedback"),
        pytest.param((0, 0), (0, 0), "pass", "too little feedback", id="nobody-rated"),
    ],
)
def test_thumbs_down_rate_fails_only_on_enough_significantly_worse_feedback(
    cand: tuple[int, int], base: tuple[int, int], outcome: str, why: str
) -> None:
    verdict = analyze_canary(_rated(BASE, *base), _rated(window(CANARY, 400, errors=1, seed=2), *cand), POLICY)
    check = _feedback(verdict)
    assert (check.outcome, check.higher_is_better) == (outcome, False)
    assert why in check.reason
    assert verdict.failing == (("thumbs_down_rate",) if outcome == "fail" else ())
    if outcome == "fail":
        assert check.p_value is not None and check.p_value < POLICY.alpha
        assert verdict.metrics()["canary.thumbs_down_rate"] == pytest.approx(0.4)


def test_thumbs_down_rate_waits_for_min_samples_like_the_other_comparisons() -> None:
    verdict = analyze_canary(_rated(BASE, 1000, 100), _rated(window(CANARY, 50, seed=2), 50, 50), POLICY)
    assert _feedback(verdict).outcome == "inconclusive"


def test_min_feedback_and_tolerance_come_from_the_policy() -> None:
    strict = RolloutPolicy(min_feedback=10, thresholds=RolloutThresholds(thumbs_down_tolerance=0.0))
    cand = _rated(window(CANARY, 400, errors=1, seed=2), 20, 8)
    assert _feedback(analyze_canary(_rated(BASE, 1000, 100), cand, POLICY)).outcome == "pass"
    assert _feedback(analyze_canary(_rated(BASE, 1000, 100), cand, strict)).outcome == "fail"
