"""What a request leaves behind once its response is out: the request-log row, usage, the token-budget
reconciliation and the per-version metrics (``Recorder.record``), and the row of a request refused before
generation (``Recorder.rejected``). ``Gateway.finish`` runs ``record`` exactly once per request, in a worker thread.

A request-log row's ``http_status`` is the status the client was told: 200 for an answer, the error's own status
for a refused request, and for a stream that failed after its 200 the status its error event carries (the 200 was
only a formality of streaming); ``status`` then says ``error``, never ``aborted``.
"""

from __future__ import annotations

import logging
import time
from datetime import UTC, datetime

from core.refusal import is_refusal
from serving.config import ServingConfig
from serving.engines.brownout import TtftWindow
from serving.pipeline.call import Call
from serving.pipeline.cost import CostMeter
from serving.pipeline.limits import RateLimiter
from serving.pipeline.metrics import ServingMetrics
from serving.state.store import ApiKey, RequestLogEntry, ServingStore
from serving.wire.errors import APIError

log = logging.getLogger("lifecycle.serving")


class Recorder:
    def __init__(
        self, cfg: ServingConfig, store: ServingStore, limiter: RateLimiter, metrics: ServingMetrics, cost: CostMeter
    ) -> None:
        self.cfg = cfg
        self.cost = cost
        self.store = store
        self.limiter = limiter
        self.metrics = metrics
        self.ttft: dict[str, TtftWindow] = {}  # per engine key: brownout reads its recent p90

    def record(self, call: Call) -> None:
        ref = call.served.ref
        m = self.metrics
        ttft_ms, tpot_ms, e2e_ms = call.timings()
        prompt_tokens = len(call.prompt_ids)
        m.requests.labels(ref, call.route, call.status).inc()
        m.e2e.labels(ref).observe(e2e_ms / 1000)
        m.tokens.labels(ref, "prompt").inc(prompt_tokens)
        m.tokens.labels(ref, "completion").inc(call.completion_tokens)
        cost_usd = self.cost.finish(ref, call.completion_tokens, call.busy_s)
        if ttft_ms is not None:
            m.ttft.labels(ref).observe(ttft_ms / 1000)
            self.ttft.setdefault(call.served.engine.key, TtftWindow(self.cfg.brownout.window_s)).add(ttft_ms)
        if tpot_ms is not None:
            m.tpot.labels(ref).observe(tpot_ms / 1000)
        if (
            call.status == "ok"
            and ttft_ms is not None
            and ttft_ms <= self.cfg.slo.ttft_ms
            and (tpot_ms is None or tpot_ms <= self.cfg.slo.tpot_ms)
        ):
            m.goodput.labels(ref).inc()
        try:
            if call.key is not None:
                tpm = call.key.tokens_per_minute or self.cfg.api_keys.tokens_per_minute
                if call.reserved_tokens:
                    self.limiter.reconcile(
                        call.key.id, tpm, call.reserved_tokens, prompt_tokens + call.completion_tokens
                    )
            text = "".join(call.text)
            # with a key: its usage and the log row in one transaction (both or neither, whenever the process dies)
            write = self.store.log_answer if call.key is not None else self.store.log_request
            write(
                RequestLogEntry(
                    request_id=call.request_id,
                    at=datetime.now(UTC),
                    key_id=call.key.id if call.key else None,
                    model=call.request.model,
                    model_version=ref,
                    alias=call.served.alias,
                    route=call.route,
                    status=call.status,
                    http_status=call.http_status,
                    prompt_tokens=prompt_tokens,
                    completion_tokens=call.completion_tokens,
                    ttft_ms=ttft_ms,
                    tpot_ms=tpot_ms,
                    e2e_ms=e2e_ms,
                    stream=call.request.stream,
                    pre_filter=call.pre_filter,
                    post_filter=call.post_filter,
                    conversation_id=call.conversation_id,
                    prompt_text=call.prompt_text,
                    response_text=text,
                    finish_reason=call.finish_reason,
                    error=call.error,
                    assigned_version=call.assigned,
                    refusal=is_refusal(text) if call.status == "ok" else None,
                    context_turns=call.context_turns,
                    safety_classifier=call.safety_classifier,
                    safety_shadow_classifier=call.safety_shadow_classifier,
                    safety_shadow_rule=call.safety_shadow_rule,
                    cost_usd=cost_usd,
                    reply_digest=call.reply_digest,
                )
            )
        except Exception:  # the response is already out; losing a log row must be loud, not fatal
            log.exception("recording request %s failed", call.request_id)

    def give_back(self, call: Call) -> None:
        """Return a reservation whole (a request refused after it reserved, before it generated anything)."""
        self.give_back_tokens(call.key, call.reserved_tokens)
        call.reserved_tokens = 0

    def give_back_tokens(self, key: ApiKey | None, reserved: int) -> None:
        """Return ``reserved`` tokens to the key's per-minute budget (work that never ran)."""
        if key is not None and reserved:
            tpm = key.tokens_per_minute or self.cfg.api_keys.tokens_per_minute
            self.limiter.reconcile(key.id, tpm, reserved, 0)

    def rejected(self, request_id: str, key: ApiKey | None, model: str, exc: APIError, started: float) -> None:
        """Requests refused before generation (401 excepted: no key, nothing to attribute) still leave a row.
        (The error metric is counted by ``serving.api.http.GatewayMiddleware``.)"""
        if exc.status == 401:
            return
        try:
            self.store.log_request(
                RequestLogEntry(
                    request_id=request_id,
                    at=datetime.now(UTC),
                    key_id=key.id if key else None,
                    model=model,
                    route="rejected",
                    status="rate_limited" if exc.status == 429 else "error",
                    http_status=exc.status,
                    e2e_ms=(time.monotonic() - started) * 1000,
                    prompt_text="",
                    response_text="",
                    error=exc.message,
                )
            )
        except Exception:
            log.exception("recording rejected request %s failed", request_id)
