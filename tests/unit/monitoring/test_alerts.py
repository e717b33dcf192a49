"""The daily eval's drop check (pure) and the alert it posts to Alertmanager."""

from __future__ import annotations

import pytest

from monitoring.alerts import EVAL_DROP, eval_drop_alert, eval_drops

UP = {"accuracy": True, "toxicity": False, "refusal": True}


@pytest.mark.parametrize(
    ("previous", "current", "expected"),
    [
        ({"accuracy": 0.80}, {"accuracy": 0.75}, {"accuracy": 0.0625}),  # 6.25% worse: over 5%
        ({"accuracy": 0.80}, {"accuracy": 0.77}, {}),  # 3.75%: within
        ({"accuracy": 0.80}, {"accuracy": 0.90}, {}),  # better
        ({"toxicity": 0.10}, {"toxicity": 0.12}, {"toxicity": 0.2}),  # lower is better: up 20% is a drop
        ({"toxicity": 0.10}, {"toxicity": 0.05}, {}),
        ({}, {"accuracy": 0.1}, {}),  # the first daily eval: nothing to compare
        ({"accuracy": 0.0}, {"accuracy": 0.0}, {}),
        ({"unknown": 1.0}, {"unknown": 0.1}, {}),  # no direction: not judged
    ],
)
def test_eval_drops(previous: dict[str, float], current: dict[str, float], expected: dict[str, float]) -> None:
    assert eval_drops(previous, current, UP, max_drop=0.05) == expected


def test_the_alert_names_the_champion_and_the_worst_drop_first() -> None:
    alert = eval_drop_alert("chat/2", {"accuracy": 0.06, "toxicity": 0.2}, 0.05)
    assert alert["labels"] == {
        "alertname": EVAL_DROP,
        "severity": "warning",
        "signal": "quality",
        "model_version": "chat/2",
    }
    assert alert["annotations"]["summary"] == "chat/2: daily eval dropped over 5% (toxicity -20.0%, accuracy -6.0%)"
    assert alert["endsAt"] > alert["startsAt"]
