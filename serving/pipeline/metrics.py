"""Prometheus metrics of the gateway, per model version, on a registry of their own (one per app, so two
gateways in one process, or tests, never share counters). ``GET /metrics`` serves them in the text format, followed
by the vLLM engines' own ``vllm:*`` families.

Every label set is bounded: model versions (``chat/3``), engine keys (a weights hash, never a file path: the
engines are started with it as their served name), route templates and HTTP statuses, error codes of a fixed
vocabulary. Each family appears once: BentoML's own metrics (labelled with raw request paths) are switched off
(``serving.service``), and under BentoML, where ``PROMETHEUS_MULTIPROC_DIR`` puts every process's metrics into
files, only the ``vllm:*`` families are read back from them.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.multiprocess import MultiProcessCollector

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
        self.errors = Counter(
            "lifecycle_errors",
            "Error answers by HTTP status and code: every 4xx and 5xx response, and streams that failed after their "
            "200 (the status their error event carries).",
            ["status", "code"],
            registry=r,
        )
        self.http_requests = Counter(
            "lifecycle_http_requests",
            "HTTP requests by method, route template (unmatched: any path without a route) and status.",
            ["method", "route", "status"],
            registry=r,
        )
        self.http_seconds = Histogram(
            "lifecycle_http_request_duration_seconds",
            "Time from request to the end of the response (a stream's whole length), by route template.",
            ["route"],
            buckets=_LATENCY_S,
            registry=r,
        )
        self.safety_hits = Counter(
            "lifecycle_safety_hits", "Safety-filter hits.", ["model_version", "stage", "rule"], registry=r
        )
        self.classifier_judged = Counter(
            "lifecycle_safety_classifier_judged",
            "Prompts the pre-filter's safety classifier judged, by what decided: its screen alone (no encoder "
            "pass), the model (the encoder), or a two-model cascade's second stage.",
            ["classifier_version", "by"],
            registry=r,
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
        self.feedback = Counter(
            "lifecycle_feedback",
            "Ratings of answers received (POST /v1/feedback; rating an answer again counts again), by the version "
            "that wrote the answer and rating (up, down).",
            ["model_version", "rating"],
            registry=r,
        )
        self.busy = Counter(
            "lifecycle_engine_busy_seconds",
            "Seconds the engine replica serving a version was busy (wall time with at least one request in flight "
            "on it), counted for the versions of the requests in flight, shared evenly (serving.pipeline.cost).",
            ["model_version"],
            registry=r,
        )
        self.price = Gauge(
            "lifecycle_price_usd_per_replica_hour",
            "What one engine replica costs per hour in USD, and the hardware it is priced as (serving.cost).",
            ["model_version", "hardware"],
            registry=r,
        )
        self.cost_per_million = Gauge(
            "lifecycle_cost_usd_per_million_tokens",
            "Cost per 1M completion tokens of a version since this gateway started: busy hours x price per "
            "replica-hour / completion tokens x 1e6.",
            ["model_version"],
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

    def render(self, *, engines: bool = True) -> bytes:
        """Our families, then (``engines``) the vLLM engines' ``vllm:*`` families of this process."""
        ours = generate_latest(self.registry)
        if not engines:
            return ours
        extra = CollectorRegistry(auto_describe=False)
        extra.register(_EngineFamilies())
        return ours + generate_latest(extra)


class _EngineFamilies:
    """vLLM's metric families (its stat loggers register them process-wide): read from the multiprocess files
    when ``PROMETHEUS_MULTIPROC_DIR`` is set (BentoML sets it), else from the default registry."""

    def collect(self) -> Iterator[Metric]:
        folder = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
        if folder and os.path.isdir(folder):
            source = CollectorRegistry(auto_describe=False)
            MultiProcessCollector(source, path=folder)
            families = source.collect()
        else:
            families = REGISTRY.collect()
        for family in families:
            if family.name.startswith("vllm:"):
                yield family
