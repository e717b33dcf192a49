"""The statistical primitives against reference values: the exact binomial tail, the proportion tests at their
edges, and the order-statistic percentile bootstrap against brute-force resampling."""

from __future__ import annotations

import math

import numpy as np
import pytest

from monitoring import stats


@pytest.mark.parametrize(
    ("k", "n", "p", "expected"),
    [
        pytest.param(19, 20, 0.99, 1 - 0.99**20, id="one-error-in-20-is-not-evidence"),
        pytest.param(0, 20, 0.99, 0.01**20, id="zero-of-20"),
        pytest.param(98, 100, 0.99, 1 - 0.99**100 - 100 * 0.99**99 * 0.01, id="two-errors-in-100"),
        pytest.param(5, 10, 0.5, 638 / 1024, id="fair-coin"),
        pytest.param(10, 10, 0.3, 1.0, id="k-at-n"),
        pytest.param(-1, 10, 0.3, 0.0, id="k-below-0"),
        pytest.param(3, 10, 1.0, 0.0, id="p-one"),
    ],
)
def test_binom_cdf_matches_closed_forms(k: int, n: int, p: float, expected: float) -> None:
    assert stats.binom_cdf(k, n, p) == pytest.approx(expected, rel=1e-9, abs=1e-300)


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        pytest.param((0, 100, 0, 100, 0.01, False), 1.0, id="no-events-either-side"),
        pytest.param((100, 100, 0, 100, 0.01, False), 0.0, id="zero-se-beyond-tolerance"),
        pytest.param((100, 100, 100, 100, 0.01, False), 1.0, id="zero-se-equal"),
        pytest.param((0, 100, 40, 100, 0.05, False), 1.0, id="one-sided-ignores-an-improvement"),
        pytest.param((5, 0, 0, 100, 0.01, False), 1.0, id="empty-side"),
    ],
)
def test_proportion_test_edges(args: tuple[int, int, int, int, float, bool], expected: float) -> None:
    assert stats.proportion_excess_p_value(*args) == pytest.approx(expected, abs=1e-6)


def test_two_sided_proportion_test_catches_a_drop() -> None:
    assert stats.proportion_excess_p_value(0, 200, 80, 200, 0.05, two_sided=True) < 1e-6
    assert stats.proportion_excess_p_value(78, 200, 80, 200, 0.05, two_sided=True) > 0.5


def test_normal_helpers_agree() -> None:
    assert stats.normal_sf(stats.z_quantile(0.95)) == pytest.approx(0.05)
    assert stats.normal_sf(0.0) == 0.5 and math.isclose(stats.normal_sf(-10), 1.0)


@pytest.mark.parametrize("q", [50.0, 95.0, 99.0, 99.9])
def test_order_statistic_bootstrap_matches_brute_force_resampling(q: float) -> None:
    rng = np.random.default_rng(7)
    values = rng.lognormal(5, 0.7, 300)
    values[:40] = values[0]  # ties
    fast = stats.resampled_percentile(np.sort(values), q, 20_000, np.random.default_rng(1))
    idx = np.random.default_rng(2).integers(0, values.size, size=(20_000, values.size))
    slow = np.percentile(values[idx], q, axis=1)
    spread = float(np.std(slow))
    assert abs(fast.mean() - slow.mean()) < 0.05 * spread
    for level in (0.05, 0.5, 0.95):
        assert abs(np.quantile(fast, level) - np.quantile(slow, level)) < 0.1 * spread


def test_paired_bootstrap_needs_equal_sizes() -> None:
    with pytest.raises(ValueError, match="equal sizes"):
        stats.bootstrap_percentile_deltas(np.ones(3), np.ones(4), [95], 100, 0, paired=True)
