"""Cost per 1M tokens per model version: how long the engine replicas serving each version are busy, priced per
replica-hour (``serving.cost``).

An engine replica is *busy* while at least one request is in flight on it: wall time, not CPU time (a replica
waiting on one request costs as much as one batching sixty-four). ``BusyClock`` measures it per engine and shares
each busy stretch out among the requests in flight on the engine during it (processor sharing: a second with two
requests in flight is half a second each). A version's busy seconds are its requests' shares: on an engine of its
own, exactly the wall time with at least one of its requests in flight; on a base engine shared with other versions'
LoRA adapters, its part of that engine's busy time, so nothing is counted twice and a canary batched with the
champion costs what the champion costs per token. The ``cost_usd`` of ``/v1/usage`` and the request log therefore
adds up to what ``/metrics`` shows:

    lifecycle_engine_busy_seconds_total{model_version}              busy seconds (its requests' shares)
    lifecycle_price_usd_per_replica_hour{model_version,hardware}    the configured price
    lifecycle_cost_usd_per_million_tokens{model_version}            busy hours x price / completion tokens x 1e6

Only requests that answer users count (a mirrored shadow request is the shadow version's test, not its cost of
serving); a request blocked before inference never reaches an engine and costs nothing. A request's share is
counted when it ends.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from serving.config import CostConfig
from serving.pipeline.metrics import ServingMetrics


@dataclass
class _Busy:  # one engine
    in_flight: int = 0
    since: float = 0.0  # the last change of in_flight
    busy_s: float = 0.0  # wall time with at least one request in flight
    shared_s: float = 0.0  # the integral of dt / in_flight: a request's share is its value at stop minus at start


@dataclass(frozen=True)
class Lease:
    """One request of ``version`` in flight on ``engine``; ``BusyClock.stop`` returns its share of the busy time."""

    engine: str
    version: str
    shared_at_start: float


class BusyClock:
    """Busy wall time per engine, and each request's share of it (thread-safe; ``clock`` is injectable)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._engines: dict[str, _Busy] = {}

    def _advance(self, e: _Busy) -> None:
        now = self._clock()
        if e.in_flight:
            e.busy_s += now - e.since
            e.shared_s += (now - e.since) / e.in_flight
        e.since = now

    def start(self, engine: str, version: str) -> Lease:
        """A request of ``version`` starts on ``engine``."""
        with self._lock:
            e = self._engines.setdefault(engine, _Busy())
            self._advance(e)
            e.in_flight += 1
            return Lease(engine, version, e.shared_s)

    def stop(self, lease: Lease) -> float:
        """The request ends; returns its share of the engine's busy time in seconds."""
        with self._lock:
            e = self._engines[lease.engine]
            self._advance(e)
            e.in_flight -= 1
            assert e.in_flight >= 0, f"{lease.engine}: more stops than starts"
            return e.shared_s - lease.shared_at_start

    def busy_s(self, engine: str) -> float:
        """Busy seconds of ``engine`` so far (the stretch still running included)."""
        with self._lock:
            e = self._engines.get(engine)
            if e is None:
                return 0.0
            self._advance(e)
            return e.busy_s


def cost_per_million(busy_s: float, price_usd_per_hour: float, completion_tokens: int) -> float | None:
    """USD per 1M completion tokens: busy hours x price / tokens x 1e6; None without tokens."""
    if completion_tokens <= 0:
        return None
    return busy_s / 3600 * price_usd_per_hour / completion_tokens * 1e6


class CostMeter:
    """The gateway's cost accounting: ``start``/``stop`` around each engine call, ``finish`` when it is recorded."""

    def __init__(self, cfg: CostConfig, metrics: ServingMetrics, clock: Callable[[], float] = time.monotonic) -> None:
        self.cfg = cfg
        self.metrics = metrics
        self.clock = BusyClock(clock)
        self._lock = threading.Lock()
        self._tokens: dict[str, int] = {}  # completion tokens per version
        self._busy: dict[str, float] = {}  # busy seconds per version: the shares of its finished requests

    def usd(self, busy_s: float) -> float:
        return busy_s / 3600 * self.cfg.price_usd_per_replica_hour

    def start(self, engine: str, version: str) -> Lease:
        self.metrics.price.labels(version, self.cfg.hardware).set(self.cfg.price_usd_per_replica_hour)
        return self.clock.start(engine, version)

    def stop(self, lease: Lease) -> float:
        """End one engine call; returns its share of the engine's busy time in seconds (counted for its version)."""
        share = self.clock.stop(lease)
        with self._lock:
            self._busy[lease.version] = self._busy.get(lease.version, 0.0) + share
        self.metrics.busy.labels(lease.version).inc(share)
        return share

    def finish(self, version: str, completion_tokens: int, busy_share_s: float) -> float:
        """Count a recorded request's tokens, refresh the version's cost per 1M tokens; returns its cost in USD."""
        with self._lock:
            tokens = self._tokens[version] = self._tokens.get(version, 0) + completion_tokens
            busy = self._busy.get(version, 0.0)
        per_million = cost_per_million(busy, self.cfg.price_usd_per_replica_hour, tokens)
        if per_million is not None:
            self.metrics.cost_per_million.labels(version).set(per_million)
        return self.usd(busy_share_s)
