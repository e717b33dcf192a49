"""The request pipeline of ``POST /v1/chat/completions``, independent of the web framework.

    authenticate -> requests/minute -> parse -> route (model name -> version) -> conversation history
      -> traffic split (champion or canary) -> brownout / fallback choice -> context budget -> pre-filter
      -> tokens/minute (reserved) -> engine (streamed through the post-filter; mirrored to the shadow)
      -> usage, conversation, request log, metrics

The traffic split (``split.variant``) applies to the served name while a canary has weight: its sticky key is the
conversation id (a new conversation's id is made before the split, so its later turns hash the same), else the
API key id, else the request id; a conversation continues on the version that wrote its last reply while that
version is still the champion or the challenger. The route is fixed when a request starts: a weight change never
moves a running stream. A canary whose engine is not ready is answered for by the champion
(``canary-unavailable``): users never see an error for it.

Streaming and non-streaming requests run the same generator (``_run``): text reaches a client only after the
post-filter released it, so no route can bypass the filter. When a client goes away the engine request is
aborted and only the tokens produced are counted. Everything after the response (log row, usage, token
reconciliation) is written by one ``_finish`` call that runs whatever way the request ended.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import anyio

from core.errors import NotFoundError
from core.refusal import is_refusal
from serving import context as ctxmod
from serving import protocol, split
from serving.brownout import BrownoutDecision, TtftWindow, decide
from serving.call import Call
from serving.config import ServingConfig
from serving.engine import EngineDead, GenerationRequest, close_stream
from serving.errors import APIError, bad_request, not_found, rate_limited, unauthorized, unavailable
from serving.faults import Faults
from serving.limits import RateLimiter
from serving.metrics import ServingMetrics
from serving.router import Route, Router, ServedModel
from serving.safety import SafetyFilters
from serving.shadow import Embedder, MiniLmEmbedder, PrimaryResult, ShadowMirror
from serving.store import ApiKey, RequestLogEntry, ServingStore, new_conversation_id

SHADOWED_ROUTES = ("primary", "canary", "canary-unavailable")  # the ok path: no brownout, no fallback

log = logging.getLogger("lifecycle.serving")


class Gateway:
    def __init__(
        self,
        cfg: ServingConfig,
        router: Router,
        store: ServingStore,
        limiter: RateLimiter,
        filters: SafetyFilters,
        metrics: ServingMetrics | None = None,
        embedder: Embedder | None = None,
    ) -> None:
        self.cfg = cfg
        self.router = router
        self.store = store
        self.limiter = limiter
        self.filters = filters
        self.metrics = metrics or ServingMetrics()
        self.faults = Faults(cfg.faults)
        self.shadow = ShadowMirror(
            cfg.shadow, store, filters.scorer, self.metrics, self.faults, embedder or MiniLmEmbedder()
        )
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

    async def history(
        self, key: ApiKey | None, req: protocol.ChatCompletionRequest
    ) -> tuple[str | None, list[dict], str | None]:
        """(conversation id, its messages, the version that wrote its last reply)."""
        if req.conversation_id is None:
            return None, [], None
        if key is None:
            raise bad_request("Conversations need an API key (they belong to the key)", param="conversation_id")
        if req.conversation_id == protocol.NEW_CONVERSATION:
            return protocol.NEW_CONVERSATION, [], None  # created by prepare once every check has passed
        if any(m.role in ("system", "developer") for m in req.messages):
            raise bad_request(
                "A system prompt is set when a conversation starts; send only the new turns", param="messages"
            )
        try:
            conv = await anyio.to_thread.run_sync(self.store.get_conversation, key.id, req.conversation_id)
        except NotFoundError as exc:
            raise not_found(str(exc), code="conversation_not_found") from None
        replies = [m.get("model_version") for m in conv.messages if m["role"] == "assistant"]
        messages = [{"role": m["role"], "content": m["content"]} for m in conv.messages]
        return conv.id, messages, replies[-1] if replies else None

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
        conversation_id, history, last_version = await self.history(key, req)
        new_conversation = conversation_id == protocol.NEW_CONVERSATION
        if new_conversation:  # its id exists before the split, so its later turns hash like this one
            conversation_id = new_conversation_id()
        sticky_key = conversation_id or (key.id if key else None) or request_id
        primary, assigned, split_route = self.assign(route, sticky_key, last_version)
        new_messages = [m.plain() for m in req.messages]
        served, route_kind, brownout = self.choose(replace(route, model=primary))
        if split_route is not None and route_kind == "primary":
            route_kind = split_route
        if route.canary is not None and route.canary_weight > 0:
            self.metrics.canary_routes.labels(route_kind).inc()
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
            assigned=assigned,
            new_conversation=new_conversation,
            shadow=route.shadow if route_kind in SHADOWED_ROUTES else None,
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
        if call.new_conversation and call.key is not None and call.conversation_id is not None:
            key_id, model, conv_id = call.key.id, call.request.model, call.conversation_id
            await anyio.to_thread.run_sync(
                lambda: self.store.create_conversation(key_id, model, conversation_id=conv_id)
            )

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
            # a mirrored request samples with the primary's seed (one drawn here when the client set none), so
            # the pair differs by model, not by the luck of the draw
            seed=req.seed if req.seed is not None or call.shadow is None else secrets.randbits(31),
            stop=req.stop or (),
            presence_penalty=req.presence_penalty,
            frequency_penalty=req.frequency_penalty,
            logit_bias={int(k): v for k, v in (req.logit_bias or {}).items()},
            adapter=call.served.adapter,
        )
        if call.shadow is not None:  # mirrored in the background: never awaited, never shown
            call.shadow_run = self.shadow.start(call.request_id, call.started, call.served.ref, greq, call.shadow)
        stream = self.faults.apply(call.served.ref, engine.generate(greq))
        completed = False
        try:
            async for delta in stream:
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
            aborted = not completed and call.status == "ok"
            if aborted:
                call.status = "aborted"
                call.finish_reason = call.finish_reason or "abort"

            async def end() -> None:  # one shielded step: a cancelled request still aborts and closes its stream
                if aborted:
                    await engine.abort(call.request_id)
                await close_stream(stream)

            await asyncio.shield(end())

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
        call.ended = time.monotonic()
        if call.shadow_run is not None:
            ttft_ms, _, e2e_ms = call.timings()
            text = "".join(call.text)
            call.shadow_run.primary_finished(PrimaryResult(text, call.completion_tokens, call.status, ttft_ms, e2e_ms))
        task = asyncio.get_running_loop().create_task(anyio.to_thread.run_sync(self._record, call))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def _record(self, call: Call) -> None:
        ref = call.served.ref
        m = self.metrics
        ttft_ms, tpot_ms, e2e_ms = call.timings()
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
                    assigned_version=call.assigned,
                    refusal=is_refusal("".join(call.text)) if call.status == "ok" else None,
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
        """Wait for background record writes and shadow comparisons (tests, shutdown: cancel the shadows first
        with ``shadow.cancel_all`` not to wait for them)."""
        while self._background or self.shadow.running:
            await asyncio.gather(*list(self._background), return_exceptions=True)
            await self.shadow.drain()


def new_request_id() -> str:
    return f"chatcmpl-{uuid.uuid4().hex[:24]}"


def _last_user(messages: list[dict[str, str]]) -> str:
    users = [m["content"] for m in messages if m["role"] == "user"]
    return users[-1] if users else ""
