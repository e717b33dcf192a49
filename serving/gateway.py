"""The request pipeline of ``POST /v1/chat/completions``, independent of the web framework.

    authenticate -> requests/minute -> parse -> route (model name -> version) -> conversation history
      -> context budget -> brownout / fallback choice -> pre-filter -> tokens/minute (reserved)
      -> engine (streamed through the post-filter) -> usage, conversation, request log, metrics

Streaming and non-streaming requests run the same generator (``_run``): text reaches a client only after the
post-filter released it, so no route can bypass the filter. When a client goes away the engine request is
aborted and only the tokens produced are counted. Everything after the response (log row, usage, token
reconciliation) is written by one ``_finish`` call that runs whatever way the request ended.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import anyio

from core.errors import NotFoundError
from serving import context as ctxmod
from serving import protocol
from serving.brownout import BrownoutDecision, TtftWindow, decide
from serving.config import ServingConfig
from serving.engine import EngineDead, GenerationRequest
from serving.errors import APIError, bad_request, not_found, rate_limited, unauthorized, unavailable
from serving.limits import RateLimiter
from serving.metrics import ServingMetrics
from serving.router import Route, Router, ServedModel
from serving.safety import SafetyFilters
from serving.store import ApiKey, RequestLogEntry, ServingStore

log = logging.getLogger("lifecycle.serving")


@dataclass
class Call:
    """Everything one request accumulates on its way through; ``_finish`` turns it into records."""

    request_id: str
    started: float
    key: ApiKey | None
    request: protocol.ChatCompletionRequest
    served: ServedModel
    route: str  # primary | fallback | brownout | brownout-fallback
    brownout: BrownoutDecision
    prompt_ids: list[int]
    max_tokens: int
    new_messages: list[dict[str, str]]
    conversation_id: str | None
    reserved_tokens: int = 0
    completion_tokens: int = 0
    text: list[str] = field(default_factory=list)
    first_token_at: float | None = None
    finish_reason: str | None = None
    status: str = "ok"
    pre_filter: str | None = None
    post_filter: str | None = None
    error: str | None = None
    finished: bool = False
    created: int = field(default_factory=lambda: int(time.time()))

    def headers(self) -> dict[str, str]:
        out = {"x-request-id": self.request_id, "x-model-version": self.served.header()}
        if self.brownout.active:
            out["x-brownout"] = self.brownout.header()
        if self.route.endswith("fallback"):
            out["x-fallback"] = "engine-unavailable" if self.route == "fallback" else "brownout"
        if self.conversation_id:
            out["x-conversation-id"] = self.conversation_id
        return out


class Gateway:
    def __init__(
        self,
        cfg: ServingConfig,
        router: Router,
        store: ServingStore,
        limiter: RateLimiter,
        filters: SafetyFilters,
        metrics: ServingMetrics | None = None,
    ) -> None:
        self.cfg = cfg
        self.router = router
        self.store = store
        self.limiter = limiter
        self.filters = filters
        self.metrics = metrics or ServingMetrics()
        self._ttft: dict[str, TtftWindow] = {}
        self._background: set[asyncio.Task[None]] = set()

    # --- the steps ------------------------------------------------------------------------------------------

    async def authenticate(self, authorization: str | None) -> ApiKey | None:
        if not self.cfg.api_keys.required:
            return None
        if not authorization or not authorization.lower().startswith("bearer "):
            raise unauthorized(
                "Missing API key: send 'Authorization: Bearer <key>' (create one: lifecycle keys create)"
            )
        secret = authorization[7:].strip()
        key = await anyio.to_thread.run_sync(self.store.authenticate, secret)
        if key is None:
            raise unauthorized("Invalid or revoked API key")
        return key

    def check_rate(self, key: ApiKey | None) -> None:
        if key is None:
            return
        rpm = key.requests_per_minute or self.cfg.api_keys.requests_per_minute
        decision = self.limiter.check_request(key.id, rpm)
        if not decision.allowed:
            raise rate_limited(
                f"Rate limit reached for requests: {rpm} per minute. Try again in {decision.retry_after_s} s.",
                decision.retry_after_s,
                code="rate_limit_requests",
            )

    @staticmethod
    def parse(body: bytes) -> protocol.ChatCompletionRequest:
        from pydantic import ValidationError

        try:
            raw = json.loads(body)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise bad_request(f"The request body is not valid JSON: {exc}", code="invalid_json") from None
        if not isinstance(raw, dict):
            raise bad_request("The request body must be a JSON object", code="invalid_json")
        try:
            req = protocol.ChatCompletionRequest.model_validate(raw)
        except ValidationError as exc:
            first = exc.errors()[0]
            param = ".".join(str(p) for p in first["loc"])
            raise APIError(
                422, f"Invalid request: {param}: {first['msg']}", code="invalid_value", param=param
            ) from None
        req.check_supported()
        return req

    def route(self, model: str) -> Route:
        try:
            return self.router.route(model)
        except NotFoundError as exc:
            raise not_found(str(exc), code="model_not_found") from None

    async def history(self, key: ApiKey | None, req: protocol.ChatCompletionRequest) -> tuple[str | None, list[dict]]:
        if req.conversation_id is None:
            return None, []
        if key is None:
            raise bad_request("Conversations need an API key (they belong to the key)", param="conversation_id")
        if req.conversation_id == protocol.NEW_CONVERSATION:
            return protocol.NEW_CONVERSATION, []  # created by prepare once every check has passed
        if any(m.role in ("system", "developer") for m in req.messages):
            raise bad_request(
                "A system prompt is set when a conversation starts; send only the new turns", param="messages"
            )
        try:
            conv = await anyio.to_thread.run_sync(self.store.get_conversation, key.id, req.conversation_id)
        except NotFoundError as exc:
            raise not_found(str(exc), code="conversation_not_found") from None
        return conv.id, [{"role": m["role"], "content": m["content"]} for m in conv.messages]

    def choose(self, route: Route) -> tuple[ServedModel, str, BrownoutDecision]:
        primary, fallback = route.model, route.fallback
        fallback_ready = fallback is not None and fallback.engine.state == "ready"
        if primary.engine.state != "ready":
            if route.follows_alias and fallback is not None and fallback_ready:
                self.metrics.fallback.labels("engine_unavailable").inc()
                return fallback.via(fallback.alias), "fallback", BrownoutDecision(False)
            raise unavailable(f"{primary.ref} is unavailable (engine {primary.engine.state}) and no fallback is ready")
        window = self._ttft.get(primary.engine.key)
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

    async def prepare(self, key: ApiKey | None, req: protocol.ChatCompletionRequest, request_id: str) -> Call:
        started = time.monotonic()
        route = self.route(req.model)
        conversation_id, history = await self.history(key, req)
        new_messages = [m.plain() for m in req.messages]
        served, route_kind, brownout = self.choose(route)
        engine = served.engine
        fitted = ctxmod.fit(
            engine.tokenizer, history + new_messages, engine.max_model_len, req.requested_max_tokens(), self.cfg.context
        )
        max_tokens = (
            min(fitted.max_tokens, brownout.max_tokens)
            if brownout.active and brownout.max_tokens
            else fitted.max_tokens
        )
        call = Call(
            request_id,
            started,
            key,
            req,
            served,
            route_kind,
            brownout,
            fitted.token_ids,
            max_tokens,
            new_messages,
            conversation_id,
        )
        verdict = self.filters.pre.check(history + new_messages) if self.cfg.safety.pre_filter else None
        if verdict is not None and verdict.blocked:
            call.pre_filter = verdict.rule or "blocked"
            call.status = "content_filter"
            self.metrics.safety_hits.labels(served.ref, "pre", call.pre_filter).inc()
            await self._start_conversation(call)
            return call
        if key is not None:
            tpm = key.tokens_per_minute or self.cfg.api_keys.tokens_per_minute
            want = len(fitted.token_ids) + max_tokens
            decision = self.limiter.reserve_tokens(key.id, tpm, want)
            if not decision.allowed:
                why = (
                    f"this request needs {want} tokens (prompt + max_tokens), more than the key's whole limit of "
                    f"{tpm} tokens per minute: lower max_tokens or shorten the prompt"
                    if decision.never
                    else f"Rate limit reached for tokens: {tpm} per minute; this request reserves {want}. "
                    f"Try again in {decision.retry_after_s} s."
                )
                if decision.never:  # waiting cannot help: no Retry-After
                    raise APIError(429, why, type="rate_limit_error", code="request_too_large")
                raise rate_limited(why, decision.retry_after_s, code="rate_limit_tokens")
            call.reserved_tokens = want
        await self._start_conversation(call)
        return call

    async def _start_conversation(self, call: Call) -> None:
        """A requested new conversation exists only once the request is accepted: a refused request leaves none."""
        if call.conversation_id == protocol.NEW_CONVERSATION and call.key is not None:
            key_id, model = call.key.id, call.request.model
            conv = await anyio.to_thread.run_sync(lambda: self.store.create_conversation(key_id, model))
            call.conversation_id = conv.id

    # --- generation -----------------------------------------------------------------------------------------

    async def run(self, call: Call) -> AsyncGenerator[str, None]:
        """Released text pieces; on return ``call.finish_reason`` is set. Cancelling the iteration (a client
        disconnect) aborts the engine request. ``finish`` must be called afterwards in every case."""
        if call.pre_filter:
            call.text.append(self.cfg.safety.refusal_text)
            call.finish_reason = "content_filter"
            yield self.cfg.safety.refusal_text
            return
        req = call.request
        stream_filter = self.filters.stream() if self.cfg.safety.post_filter else None
        engine = call.served.engine
        greq = GenerationRequest(
            request_id=call.request_id,
            prompt_token_ids=call.prompt_ids,
            max_tokens=call.max_tokens,
            temperature=req.temperature,
            top_p=req.top_p,
            seed=req.seed,
            stop=req.stop or (),
            presence_penalty=req.presence_penalty,
            frequency_penalty=req.frequency_penalty,
            logit_bias={int(k): v for k, v in (req.logit_bias or {}).items()},
            adapter=call.served.adapter,
        )
        completed = False
        try:
            async for delta in engine.generate(greq):
                if call.first_token_at is None and delta.new_tokens:
                    call.first_token_at = time.monotonic()
                call.completion_tokens += delta.new_tokens
                if delta.finish_reason:
                    call.finish_reason = delta.finish_reason
                released = stream_filter.feed(delta.text) if stream_filter else delta.text
                if stream_filter is not None and stream_filter.violation is not None:
                    await engine.abort(call.request_id)
                    async for piece in self._stopped(call, stream_filter.violation.rule or "blocked"):
                        yield piece
                    completed = True
                    return
                if released:
                    call.text.append(released)
                    yield released
            tail = stream_filter.finish() if stream_filter else ""
            if stream_filter is not None and stream_filter.violation is not None:
                async for piece in self._stopped(call, stream_filter.violation.rule or "blocked"):
                    yield piece
            elif tail:
                call.text.append(tail)
                yield tail
            completed = True
        except EngineDead as exc:
            call.status, call.error = "error", str(exc)
            raise unavailable(f"{call.served.ref}: the engine stopped during the request") from None
        finally:
            if not completed and call.status == "ok":
                call.status = "aborted"
                call.finish_reason = call.finish_reason or "abort"
                await asyncio.shield(engine.abort(call.request_id))

    async def _stopped(self, call: Call, rule: str) -> AsyncIterator[str]:
        call.post_filter = rule
        call.status = "content_filter"
        call.finish_reason = "content_filter"
        self.metrics.safety_hits.labels(call.served.ref, "post", rule).inc()
        text = self.cfg.safety.stopped_text
        call.text.append(text)
        yield text

    async def complete(self, call: Call) -> dict[str, Any]:
        """The non-streaming response (the same pipeline, collected)."""
        async for _ in self.run(call):
            pass
        await self._save_turns(call)
        return protocol.completion(
            call.request_id,
            call.request.model,
            "".join(call.text),
            call.finish_reason,
            len(call.prompt_ids),
            call.completion_tokens,
            call.conversation_id,
            call.created,
        )

    async def sse(self, call: Call) -> AsyncIterator[bytes]:
        """Server-Sent Events in the OpenAI chunk format, then ``data: [DONE]``."""
        model, rid, created, conv = call.request.model, call.request_id, call.created, call.conversation_id

        def frame(obj: dict[str, Any]) -> bytes:
            return b"data: " + json.dumps(obj, ensure_ascii=False).encode() + b"\n\n"

        pieces = self.run(call)
        try:
            yield frame(protocol.chunk(rid, model, created, {"role": "assistant", "content": ""}, None, conv))
            try:
                async for piece in pieces:
                    yield frame(protocol.chunk(rid, model, created, {"content": piece}, None, conv))
            except APIError as exc:
                yield frame(exc.body())
                yield b"data: [DONE]\n\n"
                return
            await self._save_turns(call)
            yield frame(protocol.chunk(rid, model, created, {}, call.finish_reason, conv))
            opts = call.request.stream_options
            if opts is not None and opts.include_usage:
                yield frame(protocol.usage_chunk(rid, model, created, len(call.prompt_ids), call.completion_tokens))
            yield b"data: [DONE]\n\n"
        finally:
            await pieces.aclose()  # a client that left mid-stream: abort the engine request now, not at GC
            self.finish(call)

    async def _save_turns(self, call: Call) -> None:
        """The new turns and the reply join the conversation before the response ends, so a client's next turn
        always sees them (only the log, usage and metrics are written after)."""
        if call.key is None or not call.conversation_id or call.status not in ("ok", "content_filter"):
            return
        key_id, conv_id, ref = call.key.id, call.conversation_id, call.served.ref
        reply = {"role": "assistant", "content": "".join(call.text)}

        def save() -> None:
            self.store.append_messages(key_id, conv_id, call.new_messages, None)
            self.store.append_messages(key_id, conv_id, [reply], ref)

        await anyio.to_thread.run_sync(save)

    # --- after the response ---------------------------------------------------------------------------------

    def finish(self, call: Call) -> None:
        """Record the request (log row, usage, conversation, token reconciliation, metrics) exactly once, in
        the background so a disconnecting client cannot cancel it."""
        if call.finished:
            return
        call.finished = True
        task = asyncio.get_running_loop().create_task(anyio.to_thread.run_sync(self._record, call))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def _record(self, call: Call) -> None:
        end = time.monotonic()
        ref = call.served.ref
        m = self.metrics
        ttft_ms = (call.first_token_at - call.started) * 1000 if call.first_token_at else None
        tpot_ms = (
            (end - call.first_token_at) * 1000 / (call.completion_tokens - 1)
            if call.first_token_at and call.completion_tokens > 1
            else None
        )
        e2e_ms = (end - call.started) * 1000
        prompt_tokens = len(call.prompt_ids)
        m.requests.labels(ref, call.route, call.status).inc()
        m.e2e.labels(ref).observe(e2e_ms / 1000)
        m.tokens.labels(ref, "prompt").inc(prompt_tokens)
        m.tokens.labels(ref, "completion").inc(call.completion_tokens)
        if ttft_ms is not None:
            m.ttft.labels(ref).observe(ttft_ms / 1000)
            self._ttft.setdefault(call.served.engine.key, TtftWindow(self.cfg.brownout.window_s)).add(ttft_ms)
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
                self.store.record_usage(call.key.id, ref, prompt_tokens, call.completion_tokens)
            self.store.log_request(
                RequestLogEntry(
                    request_id=call.request_id,
                    at=datetime.now(UTC),
                    key_id=call.key.id if call.key else None,
                    model=call.request.model,
                    model_version=ref,
                    alias=call.served.alias,
                    route=call.route,
                    status=call.status,
                    http_status=200,
                    prompt_tokens=prompt_tokens,
                    completion_tokens=call.completion_tokens,
                    ttft_ms=ttft_ms,
                    tpot_ms=tpot_ms,
                    e2e_ms=e2e_ms,
                    stream=call.request.stream,
                    pre_filter=call.pre_filter,
                    post_filter=call.post_filter,
                    conversation_id=call.conversation_id,
                    prompt_text=_last_user(call.new_messages),
                    response_text="".join(call.text),
                    finish_reason=call.finish_reason,
                    error=call.error,
                )
            )
        except Exception:  # the response is already out; losing a log row must be loud, not fatal
            log.exception("recording request %s failed", call.request_id)

    def log_rejected(self, request_id: str, key: ApiKey | None, model: str, exc: APIError, started: float) -> None:
        """Requests refused before generation (401 excepted: no key, nothing to attribute) still leave a row.
        (The error metric is counted by the app's error handler.)"""
        if exc.status == 401:
            return
        try:
            self.store.log_request(
                RequestLogEntry(
                    request_id=request_id,
                    at=datetime.now(UTC),
                    key_id=key.id if key else None,
                    model=model,
                    model_version=None,
                    alias=None,
                    route="rejected",
                    status="rate_limited" if exc.status == 429 else "error",
                    http_status=exc.status,
                    prompt_tokens=0,
                    completion_tokens=0,
                    ttft_ms=None,
                    tpot_ms=None,
                    e2e_ms=(time.monotonic() - started) * 1000,
                    stream=False,
                    pre_filter=None,
                    post_filter=None,
                    conversation_id=None,
                    prompt_text="",
                    response_text="",
                    finish_reason=None,
                    error=exc.message,
                )
            )
        except Exception:
            log.exception("recording rejected request %s failed", request_id)

    async def drain(self) -> None:
        """Wait for background record writes (tests, shutdown)."""
        while self._background:
            await asyncio.gather(*list(self._background), return_exceptions=True)


def new_request_id() -> str:
    return f"chatcmpl-{uuid.uuid4().hex[:24]}"


def _last_user(messages: list[dict[str, str]]) -> str:
    users = [m["content"] for m in messages if m["role"] == "user"]
    return users[-1] if users else ""
