"""The safety classifier's operating threshold: the lowest score whose false blocks stay within each budget."""

from __future__ import annotations

import pytest

from training.classifier import choose_threshold, rates


@pytest.mark.parametrize(
    ("benign", "budgets", "floor", "expected"),
    [
        # no false block allowed: just above the highest benign score
        ({"benign": [0.1, 0.2, 0.6]}, {"benign": 0.0}, 0.3, 0.6),
        # one of four allowed (0.25): just above the second highest
        ({"benign": [0.1, 0.2, 0.6, 0.9]}, {"benign": 0.25}, 0.0, 0.6),
        # the budget allows every item: the floor decides
        ({"benign": [0.9]}, {"benign": 1.0}, 0.3, 0.3),
        # two kinds: the stricter one decides
        ({"benign": [0.1, 0.4], "benign_risky": [0.7, 0.2]}, {"benign": 0.0, "benign_risky": 0.0}, 0.0, 0.7),
    ],
)
def test_threshold_table(
    benign: dict[str, list[float]], budgets: dict[str, float], floor: float, expected: float
) -> None:
    t = choose_threshold([0.95], benign, budgets, floor)
    assert t == pytest.approx(expected, abs=1e-9) and t >= expected
    for kind, scores in benign.items():  # the chosen threshold honours every budget
        assert rates(scores, t) <= budgets[kind]


def test_rates_count_scores_at_or_above() -> None:
    assert rates([0.1, 0.5, 0.9], 0.5) == pytest.approx(2 / 3)
