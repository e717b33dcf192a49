"""Which version answers a request on its route: the traffic split (champion or canary, sticky), then the
primary's availability (a dead engine sends the served name to the fallback) and brownout (a capped ``max_tokens``,
or the fallback). ``Gateway.prepare`` and the completions route call ``select`` once per request.
"""

from __future__ import annotations

from dataclasses import replace

from serving.config import ServingConfig
from serving.engines import split
from serving.engines.brownout import BrownoutDecision, TtftWindow, decide
from serving.engines.router import Route, ServedModel
from serving.pipeline.metrics import ServingMetrics
from serving.wire.errors import unavailable


class Selection:
    """The split and the brownout decision, on the gateway's metrics and its recent TTFT per engine."""

    def __init__(self, cfg: ServingConfig, metrics: ServingMetrics, ttft: dict[str, TtftWindow]) -> None:
        self.cfg = cfg
        self.metrics = metrics
        self.ttft = ttft  # the recorder's windows, per engine key

    def assign(self, route: Route, sticky_key: str, last_version: str | None) -> tuple[ServedModel, str, str | None]:
        """The traffic split: (the version to answer, the version assigned, the route it implies or None).
        A canary assigned but not ready is answered for by the champion (``canary-unavailable``)."""
        champion, canary = route.model, route.canary
        if canary is None or route.canary_weight <= 0:
            return champion, champion.ref, None
        variant = split.variant(
            sticky_key, route.canary_weight, last_version=last_version, champion=champion.ref, challenger=canary.ref
        )
        if variant == "champion":
            return champion, champion.ref, None
        if canary.engine.state != "ready":
            return champion, canary.ref, "canary-unavailable"
        return canary, canary.ref, "canary"

    def choose(self, route: Route) -> tuple[ServedModel, str, BrownoutDecision]:
        primary, fallback = route.model, route.fallback
        fallback_ready = fallback is not None and fallback.engine.state == "ready"
        if primary.engine.state != "ready":
            if route.follows_alias and fallback is not None and fallback_ready:
                self.metrics.fallback.labels("engine_unavailable").inc()
                return fallback.via(fallback.alias), "fallback", BrownoutDecision(False)
            raise unavailable(
                f"{primary.ref} is unavailable (engine {primary.engine.state}) and no fallback is ready",
                self.cfg.limits.retry_after_s,
            )
        window = self.ttft.get(primary.engine.key)
        decision = decide(
            primary.engine.queue_depth,
            window.p90() if window else None,
            self.cfg.brownout,
            fallback_ready and route.follows_alias,
        )
        if not decision.active:
            return primary, "primary", decision
        if decision.use_fallback and fallback is not None:
            self.metrics.brownout.labels("fallback").inc()
            self.metrics.fallback.labels("brownout").inc()
            return fallback, "brownout-fallback", decision
        self.metrics.brownout.labels("max_tokens").inc()
        return primary, "brownout", decision

    def select(
        self, route: Route, sticky_key: str, last_version: str | None
    ) -> tuple[ServedModel, str, BrownoutDecision, str | None]:
        """The traffic split, then availability and brownout: (the version that answers, the route kind, the
        brownout decision, the version the split assigned)."""
        primary, assigned, split_route = self.assign(route, sticky_key, last_version)
        served, route_kind, brownout = self.choose(replace(route, model=primary))
        if split_route is not None and route_kind == "primary":
            route_kind = split_route
        if route.canary is not None and route.canary_weight > 0:
            self.metrics.canary_routes.labels(route_kind).inc()
        return served, route_kind, brownout, assigned
