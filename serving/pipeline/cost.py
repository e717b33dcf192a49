"""Cost per 1M tokens per model version: how long each version's engine replicas are busy, priced per
replica-hour (``serving.cost``).

A version is *busy* while at least one of its requests is in flight on its engine: wall time, not CPU time (a
replica waiting on one request costs as much as one batching sixty-four). ``BusyClock`` measures it per version
and shares each busy stretch out among the requests in flight during it (processor sharing: a second with two
requests in flight is half a second each), so a version's busy time is the sum of its requests' shares and the
``cost_usd`` of ``/v1/usage`` and the request log adds up to what ``/metrics`` shows:

    lifecycle_engine_busy_seconds_total{model_version}              busy wall time
    lifecycle_price_usd_per_replica_hour{model_version,hardware}    the configured price
    lifecycle_cost_usd_per_million_tokens{model_version}            busy hours x price / completion tokens x 1e6

Only requests that answer users count (a mirrored shadow request is the shadow version's test, not its cost of
serving); a request blocked before inference never reaches an engine and costs nothing.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from serving.config import CostConfig
from serving.pipeline.metrics import ServingMetrics


@dataclass
class _Busy:
    in_flight: int = 0
    since: float = 0.0  # the last change of in_flight
    busy_s: float = 0.0  # wall time with at least one request in flight
    shared_s: float = 0.0  # the integral of dt / in_flight: a request's share is its value at stop minus at start


@dataclass(frozen=True)
class Lease:
    """One request in flight on ``version``; ``BusyClock.stop`` returns its share of the busy time."""

    version: str
    shared_at_start: float


class BusyClock:
    """Busy wall time per version, and each request's share of it (thread-safe; ``clock`` is injectable)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._versions: dict[str, _Busy] = {}

    def _advance(self, v: _Busy) -> float:
        now = self._clock()
        elapsed = now - v.since if v.in_flight else 0.0
        v.busy_s += elapsed
        if v.in_flight:
            v.shared_s += elapsed / v.in_flight
        v.since = now
        return elapsed

    def start(self, version: str) -> tuple[Lease, float]:
        """A request of ``version`` starts; returns its lease and the busy seconds elapsed since the last change."""
        with self._lock:
            v = self._versions.setdefault(version, _Busy())
            elapsed = self._advance(v)
            v.in_flight += 1
            return Lease(version, v.shared_s), elapsed

    def stop(self, lease: Lease) -> tuple[float, float]:
        """The request ends; returns its share of the busy time and the busy seconds since the last change."""
        with self._lock:
            v = self._versions[lease.version]
            elapsed = self._advance(v)
            v.in_flight -= 1
            assert v.in_flight >= 0, f"{lease.version}: more stops than starts"
            return v.shared_s - lease.shared_at_start, elapsed

    def busy_s(self, version: str) -> float:
        """Busy seconds of ``version`` so far (the stretch still running included)."""
        with self._lock:
            v = self._versions.get(version)
            if v is None:
                return 0.0
            self._advance(v)
            return v.busy_s


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
        self._busy: dict[str, float] = {}  # busy seconds per version, as counted so far

    def usd(self, busy_s: float) -> float:
        return busy_s / 3600 * self.cfg.price_usd_per_replica_hour

    def start(self, version: str) -> Lease:
        lease, elapsed = self.clock.start(version)
        self.metrics.price.labels(version, self.cfg.hardware).set(self.cfg.price_usd_per_replica_hour)
        self._busy_for(version, elapsed)
        return lease

    def stop(self, lease: Lease) -> float:
        """End one engine call; returns its share of the busy time in seconds."""
        share, elapsed = self.clock.stop(lease)
        self._busy_for(lease.version, elapsed)
        return share

    def _busy_for(self, version: str, elapsed: float) -> None:
        with self._lock:
            self._busy[version] = self._busy.get(version, 0.0) + elapsed
        self.metrics.busy.labels(version).inc(elapsed)

    def finish(self, version: str, completion_tokens: int, busy_share_s: float) -> float:
        """Count a recorded request's tokens, refresh the version's cost per 1M tokens; returns its cost in USD."""
        with self._lock:
            tokens = self._tokens[version] = self._tokens.get(version, 0) + completion_tokens
            busy = self._busy.get(version, 0.0)
        per_million = cost_per_million(busy, self.cfg.price_usd_per_replica_hour, tokens)
        if per_million is not None:
            self.metrics.cost_per_million.labels(version).set(per_million)
        return self.usd(busy_share_s)
