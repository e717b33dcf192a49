"""Brownout: ``decide`` as a table (thresholds are inclusive, the fallback only when it is ready and enabled) and the
TTFT window's p90 and expiry, driven with explicit ``now`` values."""

from __future__ import annotations

import random

import pytest

from serving.config import BrownoutConfig
from serving.engines.brownout import BrownoutDecision, TtftWindow, decide

CFG = BrownoutConfig(queue_depth=8, ttft_ms=1000, window_s=10, max_tokens=32, use_fallback=True)


@pytest.mark.parametrize(
    ("cfg", "queue", "ttft", "fallback_ready", "expected"),
    [
        # disabled: never, whatever the load
        (CFG.model_copy(update={"enabled": False}), 1000, 1e9, True, BrownoutDecision(False)),
        # below both thresholds, or no TTFT measured yet
        (CFG, 0, None, True, BrownoutDecision(False)),
        (CFG, 7, 999.9, True, BrownoutDecision(False)),
        # queue depth at the threshold
        (CFG, 8, None, True, BrownoutDecision(True, ("queue_depth=8",), 32, True)),
        (CFG, 50, 10.0, False, BrownoutDecision(True, ("queue_depth=50",), 32, False)),
        # TTFT p90 at the threshold
        (CFG, 0, 1000.0, True, BrownoutDecision(True, ("ttft_p90_ms=1000",), 32, True)),
        # both: both reasons, queue first
        (CFG, 9, 2500.4, True, BrownoutDecision(True, ("queue_depth=9", "ttft_p90_ms=2500"), 32, True)),
        # the fallback only when it is ready ...
        (CFG, 8, None, False, BrownoutDecision(True, ("queue_depth=8",), 32, False)),
        # ... and when the config allows it
        (CFG.model_copy(update={"use_fallback": False}), 8, None, True, BrownoutDecision(True, ("queue_depth=8",), 32)),
    ],
)
def test_decide(
    cfg: BrownoutConfig, queue: int, ttft: float | None, fallback_ready: bool, expected: BrownoutDecision
) -> None:
    assert decide(queue, ttft, cfg, fallback_ready) == expected


@pytest.mark.parametrize(
    ("decision", "header"),
    [
        (BrownoutDecision(True, ("queue_depth=8",), 32, True), "max_tokens=32; fallback; reason=queue_depth=8"),
        (
            BrownoutDecision(True, ("queue_depth=9", "ttft_p90_ms=2500"), 16, False),
            "max_tokens=16; reason=queue_depth=9,ttft_p90_ms=2500",
        ),
    ],
)
def test_header_names_the_actions_and_reasons(decision: BrownoutDecision, header: str) -> None:
    assert decision.header() == header


def test_empty_window_has_no_p90() -> None:
    assert TtftWindow(10).p90(now=0.0) is None


def test_p90_of_unordered_samples() -> None:
    window = TtftWindow(10)
    values = list(range(1, 16))  # 15 samples: the 90th percentile (nearest rank: the 14th) is 14
    random.Random(0).shuffle(values)
    for v in values:
        window.add(float(v), now=1.0)
    assert window.p90(now=1.0) == 14.0


def test_p90_of_one_sample_is_that_sample() -> None:
    window = TtftWindow(10)
    window.add(123.0, now=0.0)
    assert window.p90(now=0.0) == 123.0


def test_one_outlier_in_ten_does_not_make_the_p90() -> None:
    window = TtftWindow(10)
    for _ in range(9):
        window.add(100.0, now=0.0)
    window.add(60_000.0, now=0.0)
    assert window.p90(now=0.0) == 100.0


def test_samples_expire_after_the_window() -> None:
    window = TtftWindow(10)
    window.add(9000.0, now=0.0)
    window.add(100.0, now=5.0)
    assert window.p90(now=10.0) == 9000.0  # exactly window_s old: still in
    assert window.p90(now=10.001) == 100.0  # older than window_s: gone
    assert window.p90(now=15.001) is None
    window.add(200.0, now=20.0)  # the window keeps working after emptying
    assert window.p90(now=20.0) == 200.0


def test_slow_period_ends_when_its_samples_expire() -> None:
    """A burst of slow first tokens turns brownout on; once it has aged out of the window, it is off again."""
    window = TtftWindow(CFG.window_s)
    for i in range(20):
        window.add(4000.0, now=float(i) / 10)
    assert decide(0, window.p90(now=2.0), CFG, True).active
    window.add(50.0, now=12.5)
    assert not decide(0, window.p90(now=12.5), CFG, True).active
