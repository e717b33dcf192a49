"""Busy time and cost per version (``serving.pipeline.cost``) on a hand-driven clock: an engine is busy while at
least one request is in flight on it, each request's share splits overlapping time evenly (across the versions
sharing the engine too), and the shares add up to the busy time."""

from __future__ import annotations

import pytest
from unit.serving.fakes import Clock

from serving.config import CostConfig
from serving.pipeline.cost import BusyClock, CostMeter, cost_per_million
from serving.pipeline.metrics import ServingMetrics


def test_busy_time_counts_overlap_once_and_shares_it_between_the_requests_in_flight() -> None:
    t = Clock(100.0)
    clock = BusyClock(t)
    a = clock.start("base", "chat/1")
    t.now += 2  # a alone: 2 s
    b = clock.start("base", "chat/2")  # another version's adapter on the same base engine
    t.now += 4  # a and b: 4 s, 2 s each
    share_a = clock.stop(a)
    t.now += 1  # b alone: 1 s
    share_b = clock.stop(b)
    t.now += 10  # idle: not busy
    other = clock.start("full", "chat/3")  # an engine of its own
    t.now += 3
    assert (share_a, share_b) == (4.0, 3.0)
    assert clock.busy_s("base") == 7.0 == share_a + share_b
    assert clock.busy_s("full") == 3.0  # the stretch still running counts
    assert clock.stop(other) == 3.0


def test_the_meter_prices_shares_and_publishes_the_cost_per_million_tokens() -> None:
    t, metrics = Clock(100.0), ServingMetrics()
    meter = CostMeter(CostConfig(hardware="test-gpu", price_usd_per_replica_hour=3.6), metrics, t)
    first, second = meter.start("base", "chat/1"), meter.start("base", "chat/1")
    t.now += 10
    shares = [meter.stop(first), meter.stop(second)]
    assert [meter.finish("chat/1", 250, s) for s in shares] == pytest.approx([0.005, 0.005])  # 5 s each at 3.6 USD/h
    sample = metrics.registry.get_sample_value
    assert sample("lifecycle_engine_busy_seconds_total", {"model_version": "chat/1"}) == 10.0
    assert sample("lifecycle_price_usd_per_replica_hour", {"model_version": "chat/1", "hardware": "test-gpu"}) == 3.6
    assert sample("lifecycle_cost_usd_per_million_tokens", {"model_version": "chat/1"}) == pytest.approx(20.0)


def test_no_tokens_no_cost_per_token() -> None:
    assert cost_per_million(10.0, 3.6, 0) is None
    assert cost_per_million(3600.0, 2.0, 1_000_000) == 2.0
