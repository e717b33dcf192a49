"""Standard errors of eval metrics."""

from __future__ import annotations

import math

import pytest

from evals.report import mean_metric, proportion_stderr


def test_a_perfect_proportion_keeps_a_positive_stderr() -> None:
    perfect = mean_metric("safety/refusal_rate.weapons", {str(i): 1.0 for i in range(12)}, higher_is_better=True)
    assert perfect.value == 1.0
    assert perfect.stderr == pytest.approx(math.sqrt(14 / 16 * 2 / 16 / 16))  # plus four: p = 14/16, n + 4 = 16
    nothing = mean_metric("x/y", {str(i): 0.0 for i in range(12)}, higher_is_better=True)
    assert nothing.stderr == perfect.stderr


def test_a_middling_proportion_is_close_to_the_sample_stderr() -> None:
    items = {str(i): float(i % 2) for i in range(100)}
    sample = math.sqrt(0.25 * 100 / 99 / 100)
    assert mean_metric("x/y", items, higher_is_better=True).stderr == pytest.approx(sample, rel=0.03)
    assert proportion_stderr(50, 100) == pytest.approx(math.sqrt(0.25 / 104))


def test_non_binary_scores_use_the_sample_stderr() -> None:
    items = {"a": 0.5, "b": -0.25, "c": 0.0}
    mean = 0.25 / 3
    sample = math.sqrt(sum((v - mean) ** 2 for v in items.values()) / 2 / 3)
    assert mean_metric("x/y", items, higher_is_better=False).stderr == pytest.approx(sample)
