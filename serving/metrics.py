"""Prometheus metrics of the gateway, per model version, on a registry of their own (one per app, so two
gateways in one process, or tests, never share counters). ``/metrics`` serves them in the text format;
under BentoML they are appended to BentoML's own metrics.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

_LATENCY_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
_TPOT_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1)


class ServingMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "lifecycle_requests",
            "Chat completion requests by outcome.",
            ["model_version", "route", "status"],
            registry=r,
        )
        self.ttft = Histogram(
            "lifecycle_ttft_seconds", "Time to first token.", ["model_version"], buckets=_LATENCY_S, registry=r
        )
        self.tpot = Histogram(
            "lifecycle_tpot_seconds",
            "Time per output token after the first.",
            ["model_version"],
            buckets=_TPOT_S,
            registry=r,
        )
        self.e2e = Histogram(
            "lifecycle_e2e_seconds", "End-to-end request latency.", ["model_version"], buckets=_LATENCY_S, registry=r
        )
        self.tokens = Counter("lifecycle_tokens", "Tokens processed.", ["model_version", "kind"], registry=r)
        self.errors = Counter("lifecycle_errors", "Errors by HTTP status and code.", ["status", "code"], registry=r)
        self.safety_hits = Counter(
            "lifecycle_safety_hits", "Safety-filter hits.", ["model_version", "stage", "rule"], registry=r
        )
        self.queue_depth = Gauge(
            "lifecycle_queue_depth", "Requests waiting for their first token.", ["engine"], registry=r
        )
        self.in_flight = Gauge("lifecycle_in_flight", "Requests in flight.", ["engine"], registry=r)
        self.goodput = Counter(
            "lifecycle_goodput_requests",
            "Requests meeting both the TTFT and the TPOT target.",
            ["model_version"],
            registry=r,
        )
        self.brownout = Counter(
            "lifecycle_brownout_requests", "Requests served under brownout, by action.", ["action"], registry=r
        )
        self.fallback = Counter(
            "lifecycle_fallback_requests",
            "Requests sent to the fallback version, by reason.",
            ["reason"],
            registry=r,
        )
        self.engine_up = Gauge("lifecycle_engine_up", "1 when the engine is ready.", ["engine"], registry=r)
        self.canary_routes = Counter(
            "lifecycle_canary_routes",
            "Requests to the served name while a canary takes traffic, by route (primary: the champion answered "
            "as assigned, canary, canary-unavailable, fallback, brownout ...).",
            ["route"],
            registry=r,
        )
        self.canary_weight = Gauge(
            "lifecycle_canary_weight", "Percent of the served name's traffic assigned to the canary.", registry=r
        )
        self.shadow = Counter(
            "lifecycle_shadow_requests",
            "Requests considered for mirroring to the shadow version, by outcome (mirrored, skipped_budget, "
            "skipped_unavailable, error, discarded: the primary did not complete, nothing to compare).",
            ["shadow_version", "outcome"],
            registry=r,
        )

    def render(self) -> bytes:
        return generate_latest(self.registry)
