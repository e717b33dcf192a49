"""The request pipeline of ``POST /v1/chat/completions`` (and of ``/v1/completions``, ``serving.api.completions``),
independent of the web framework.

    authenticate -> requests/minute -> body (serving.api.body) -> parse -> route (model name -> version)
      -> conversation history -> traffic split (champion or canary) -> brownout / fallback choice
      -> context budget + pre-filter (in a worker thread) -> tokens/minute (reserved)
      -> engine (streamed through the post-filter; mirrored to the shadow)
      -> usage, conversation, request log, metrics (serving.pipeline.recorder)

Everything a client controls is checked before work is spent on it (sizes and shapes in ``serving.api.body`` and the
protocol models, the ``logit_bias`` ids against the served model's vocabulary here), and the CPU-heavy steps (the
chat template and tokenization while fitting the context, the pre-filter's rules and classifier) run in a worker
thread: the event loop keeps answering other requests and ``/healthz`` while the largest accepted request is
prepared.

A blocked turn (the pre-filter refused the prompt, or the post-filter stopped the reply) is stored in its
conversation, marked with the stage and rule that blocked it, and shown in its history, but it is kept out of the
context of every later turn: never sent to the model again, never judged again, so one refused message does not
block the rest of the conversation. The reply says so (``safety.kept_out_note``).

The traffic split (``split.variant``) applies to the served name while a canary has weight: its sticky key is the
conversation id (a new conversation's id is made before the split, so its later turns hash the same), else the
API key id, else the request id; a conversation continues on the version that wrote its last reply while that
version is still the champion or the challenger. The route is fixed when a request starts: a weight change never
moves a running stream. A canary whose engine is not ready is answered for by the champion
(``canary-unavailable``): users never see an error for it.

Streaming and non-streaming requests run the same generator (``run``): text reaches a client only after the
post-filter released it, so no route can bypass the filter. When a client goes away the engine request is
aborted and only the tokens produced are counted. A stream that fails after its 200 ends with an OpenAI-shaped
error event and ``data: [DONE]``, whatever the failure. Everything after the response (log row, usage, token
reconciliation) is written by one ``finish`` call that runs whatever way the request ended.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import threading
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from typing import Any

import anyio

from core.errors import NotFoundError
from serving.config import ServingConfig
from serving.engines.engine import Engine, EngineDead, GenerationRequest, close_stream
from serving.engines.faults import Faults
from serving.engines.router import Route, Router
from serving.pipeline import context as ctxmod
from serving.pipeline.call import Call
from serving.pipeline.context import FittedPrompt
from serving.pipeline.cost import CostMeter
from serving.pipeline.limits import RateLimiter
from serving.pipeline.metrics import ServingMetrics
from serving.pipeline.recorder import Recorder
from serving.pipeline.selection import Selection
from serving.pipeline.shadow import MiniLmEmbedder, PrimaryResult, ShadowMirror, TokenizingEmbedder
from serving.safety.filters import SafetyFilters
from serving.safety.harm_filter import judged_category
from serving.safety.verdict import FilterVerdict
from serving.state.review import ReviewItem, ReviewQueue
from serving.state.store import ApiKey, ServingStore, new_conversation_id
from serving.wire import protocol
from serving.wire.errors import (
    APIError,
    bad_request,
    not_found,
    rate_limited,
    server_error,
    unauthorized,
    unavailable,
)

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
        embedder: TokenizingEmbedder | None = None,
        review: ReviewQueue | None = None,
    ) -> None:
        self.cfg = cfg
        self.router = router
        self.store = store
        self.limiter = limiter
        self.filters = filters  # (the setter below gives its reply ledger the request log)
        self.metrics = metrics or ServingMetrics()
        self.faults = Faults(cfg.faults)
        self.embedder = embedder or MiniLmEmbedder()  # the shadow's similarity and /v1/embeddings share it
        self.shadow = ShadowMirror(cfg.shadow, store, filters.scorer, self.metrics, self.faults, self.embedder)
        self.cost = CostMeter(cfg.cost, self.metrics)
        self.recorder = Recorder(cfg, store, limiter, self.metrics, self.cost)
        self.review = review  # high-stakes classifier blocks for people to look at (serving.state.review)
        self.selection = Selection(cfg, self.metrics, self.recorder.ttft)
        self._background: set[asyncio.Task[None]] = set()
        self._recording: dict[str, asyncio.Task[None]] = {}  # request id -> its record write, while it runs
        # one tokenization at a time: a fast tokenizer's Rust state is not safe under concurrent calls
        self.tokenizing = threading.Lock()
        self.preparing = anyio.CapacityLimiter(cfg.preparing_threads())  # template, tokens, pre-filter; others wait

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

    def parse(self, raw: dict[str, Any]) -> protocol.ChatCompletionRequest:
        req = protocol.validate(protocol.ChatCompletionRequest, raw)
        req.check_supported(self.cfg.limits)
        return req

    def route(self, model: str) -> Route:
        try:
            return self.router.route(model)
        except NotFoundError as exc:
            raise not_found(str(exc), code="model_not_found") from None

    @property
    def filters(self) -> SafetyFilters:
        return self._filters

    @filters.setter
    def filters(self, filters: SafetyFilters) -> None:  # replies it has not kept: the request log's (every replica's)
        filters.replies.lookup = self.store.known_replies
        self._filters = filters

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
        # blocked turns stay in the history a client reads, never in the context the model (or the filter) sees
        messages = [{"role": m["role"], "content": m["content"]} for m in conv.messages if not m.get("filtered")]
        for m in conv.messages:  # the replies it stored are the gateway's own (after a restart too): not judged
            if m["role"] == "assistant" and m.get("model_version") and not m.get("filtered"):
                self.filters.remember_reply(m["content"])  # (an assistant turn a client sent has no version)
        return conv.id, messages, replies[-1] if replies else None

    async def prepare(self, key: ApiKey | None, req: protocol.ChatCompletionRequest, request_id: str) -> Call:
        started = time.monotonic()
        route = self.route(req.model)
        conversation_id, history, last_version = await self.history(key, req)
        new_conversation = conversation_id == protocol.NEW_CONVERSATION
        if new_conversation:  # its id exists before the split, so its later turns hash like this one
            conversation_id = new_conversation_id()
        sticky_key = conversation_id or (key.id if key else None) or request_id
        served, route_kind, brownout, assigned = self.selection.select(route, sticky_key, last_version)
        new_messages = [m.plain() for m in req.messages]
        engine = served.engine
        ctxmod.check_vocabulary(req, engine)
        fitted, verdict = await anyio.to_thread.run_sync(
            self._fit_and_judge, engine, history + new_messages, req, limiter=self.preparing
        )
        cap = brownout.max_tokens if brownout.active else None
        max_tokens = min(fitted.max_tokens, cap) if cap else fitted.max_tokens
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
            prompt_text=next((m["content"] for m in reversed(new_messages) if m["role"] == "user"), ""),
            context_turns=len(history) + len(new_messages),
            json_schema=req.tool_schema(),
        )
        call.note_classifiers(verdict)
        if verdict is not None and verdict.classifier and verdict.judged_by:
            self.metrics.classifier_judged.labels(verdict.classifier, verdict.judged_by).inc()
        if self.refuse(call, verdict):
            await self._queue_for_review(call, verdict)
            await self._start_conversation(call)
            return call
        self.reserve(call, len(fitted.token_ids) + max_tokens)
        await self._start_conversation(call)
        return call

    def refuse(self, call: Call, verdict: FilterVerdict | None) -> bool:
        """Mark a request the pre-filter blocked (it is answered with the refusal text, never by an engine)."""
        if verdict is None or not verdict.blocked:
            return False
        call.pre_filter, call.status = verdict.rule or "blocked", "content_filter"
        self.metrics.safety_hits.labels(call.served.ref, "pre", call.pre_filter).inc()
        return True

    async def _queue_for_review(self, call: Call, verdict: FilterVerdict | None) -> None:
        """A classifier block of a high-stakes category (``safety.review_categories``) goes to the review queue."""
        category = judged_category(verdict.rule) if verdict is not None else None
        if self.review is None or verdict is None or category is None:
            return
        if category in self.cfg.safety.review_categories:
            item = ReviewItem(
                call.request_id,
                category,
                verdict.score or 0.0,
                verdict.classifier or "",
                call.prompt_text,
                call.key.id if call.key else None,
            )
            await anyio.to_thread.run_sync(self.review.add, item)

    def _fit_and_judge(
        self, engine: Engine, messages: list[dict[str, str]], req: protocol.ChatCompletionRequest
    ) -> tuple[FittedPrompt, FilterVerdict | None]:
        """The CPU-heavy part of preparing a chat request (run in a worker thread): the context budget (chat
        template + tokenization) and the pre-filter (rules + classifier)."""
        with self.tokenizing:
            fitted = ctxmod.fit(
                engine.tokenizer, messages, engine.max_model_len, req.requested_max_tokens(), self.cfg.context
            )
        verdict = self.filters.pre.check(messages) if self.cfg.safety.pre_filter else None
        return fitted, verdict

    def reserve(self, call: Call, want: int) -> None:
        """Reserve ``want`` tokens (prompt + max_tokens) of the key's per-minute budget, or refuse with a 429."""
        call.reserved_tokens += self.reserve_tokens(call.key, want)

    def reserve_tokens(self, key: ApiKey | None, want: int) -> int:
        """``want`` tokens of the key's per-minute budget reserved (what was reserved: 0 without a key), or a 429."""
        if key is not None:
            tpm = key.tokens_per_minute or self.cfg.api_keys.tokens_per_minute
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
            return want
        return 0

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
            text = self._blocked_text(call, self.filters.blocked_reply(call.pre_filter))
            call.text.append(text)
            call.finish_reason = "content_filter"
            yield text
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
            logit_bias=req.bias_ids(),
            adapter=call.served.adapter,
            logprobs=call.want_logprobs,
            prompt_logprobs=call.want_prompt_logprobs,
            json_schema=call.json_schema,
        )
        if call.shadow is not None:  # mirrored in the background: never awaited, never shown
            call.shadow_run = self.shadow.start(call.request_id, call.started, call.served.ref, greq, call.shadow)
        lease = self.cost.start(engine.key, call.served.ref)  # busy until the stream is closed (end(), below)
        stream = self.faults.apply(call.served.ref, engine.generate(greq))
        completed = False
        try:
            async for delta in stream:
                if call.first_token_at is None and delta.new_tokens:
                    call.first_token_at = time.monotonic()
                call.completion_tokens += delta.new_tokens
                call.logprobs.extend(delta.logprobs)
                if delta.prompt_logprobs is not None and call.prompt_logprobs is None:
                    call.prompt_logprobs = delta.prompt_logprobs
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
            raise unavailable(
                f"{call.served.ref}: the engine stopped during the request", self.cfg.limits.retry_after_s
            ) from None
        finally:
            aborted = not completed and call.status == "ok"
            if aborted:
                call.status = "aborted"
                call.finish_reason = call.finish_reason or "abort"

            async def end() -> None:  # one shielded step: a cancelled request still aborts and closes its stream
                try:
                    if aborted:
                        await engine.abort(call.request_id)
                    await close_stream(stream)
                finally:
                    call.busy_s = self.cost.stop(lease)

            await asyncio.shield(end())

    async def _stopped(self, call: Call, rule: str) -> AsyncIterator[str]:
        call.post_filter = rule
        call.status = "content_filter"
        call.finish_reason = "content_filter"
        self.metrics.safety_hits.labels(call.served.ref, "post", rule).inc()
        text = self._blocked_text(call, self.cfg.safety.stopped_text)
        call.text.append(text)
        yield text

    def _blocked_text(self, call: Call, text: str) -> str:
        """A refusal or stop text, told that the turn stays out of its conversation when there is one."""
        return f"{text} {self.cfg.safety.kept_out_note}" if call.conversation_id else text

    def failed(self, call: Call, exc: APIError) -> None:
        """A request that failed after its response started (a stream): recorded with the status its client was
        told in the error event, counted and logged like any error answer."""
        call.status, call.http_status = "error", exc.status
        call.error = call.error or exc.message
        self.metrics.errors.labels(str(exc.status), exc.label).inc()
        log.info("stream %s failed after its 200: %d %s", call.request_id, exc.status, exc.label)

    async def events(
        self,
        call: Call,
        opening: list[dict[str, Any]],
        event: Callable[[str], dict[str, Any] | None],
        closing: Callable[[], Awaitable[list[dict[str, Any]]]],
    ) -> AsyncIterator[bytes]:
        """One request as SSE: ``opening`` events, ``event(piece)`` per released piece, ``closing()`` events,
        ``data: [DONE]``. A failure after the 200 ends the stream with an error event and ``[DONE]``."""

        def frame(obj: dict[str, Any]) -> bytes:
            return b"data: " + json.dumps(obj, ensure_ascii=False).encode() + b"\n\n"

        pieces = self.run(call)
        try:
            for obj in opening:
                yield frame(obj)
            try:
                async for piece in pieces:
                    if (made := event(piece)) is not None:  # None: held back (a tool call is sent when complete)
                        yield frame(made)
                tail = await closing()
            except Exception as exc:  # after the 200 an error can only be an event: never a dropped connection
                error = exc if isinstance(exc, APIError) else self.crashed(call, exc)
                self.failed(call, error)
                yield frame(error.body())
                yield b"data: [DONE]\n\n"
                return
            await self.settle(call)  # recorded before the client sees the stream end
            for obj in tail:
                yield frame(obj)
            yield b"data: [DONE]\n\n"
        finally:
            await pieces.aclose()  # a client that left mid-stream: abort the engine request now, not at GC
            self.finish(call)

    def crashed(self, call: Call, exc: Exception) -> APIError:
        """An unexpected failure of a request: logged with its traceback, answered as a 500 with the request id."""
        log.error("request %s failed", call.request_id, exc_info=exc)
        call.status, call.error = "error", f"{type(exc).__name__}: {exc}"
        return server_error(call.request_id)

    # --- after the response ---------------------------------------------------------------------------------

    def finish(self, call: Call) -> None:
        """Record the request (log row, usage, conversation, token reconciliation, metrics) exactly once, in
        the background so a disconnecting client cannot cancel it."""
        self._record(call)

    async def settle(self, call: Call) -> None:
        """Record a request that completed before its client is told so (the body of an answer, the last events
        of a stream): a replica killed right after answering must not lose the request-log and usage rows of
        an answer its client got (a few milliseconds of database writes per request). Cancelling the wait (a
        client that left) does not cancel the write."""
        task = self._record(call)
        if task is not None:
            await asyncio.shield(task)

    def _record(self, call: Call) -> asyncio.Task[None] | None:
        if call.finished:
            return None
        call.finished = True
        call.ended = time.monotonic()
        if call.shadow_run is not None:
            ttft_ms, _, e2e_ms = call.timings()
            text = "".join(call.text)
            call.shadow_run.primary_finished(PrimaryResult(text, call.completion_tokens, call.status, ttft_ms, e2e_ms))
        task = asyncio.get_running_loop().create_task(anyio.to_thread.run_sync(self.recorder.record, call))
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        rid = call.request_id
        self._recording[rid] = task
        task.add_done_callback(lambda t: self._recording.pop(rid) if self._recording.get(rid) is t else None)
        return task

    async def recorded(self, request_id: str) -> None:
        """Wait until the record write of ``request_id`` (if one is running) is done: a client rating an answer
        right after its response must find the request-log row (``serving.api.feedback``). Answers are recorded
        before their client gets them (``settle``); this covers the requests recorded in the background."""
        task = self._recording.get(request_id)
        if task is not None:
            await asyncio.wait({task})

    def log_rejected(self, request_id: str, key: ApiKey | None, model: str, exc: APIError, started: float) -> None:
        self.recorder.rejected(request_id, key, model, exc, started)

    async def drain(self) -> None:
        """Wait for background record writes and shadow comparisons (tests, shutdown: cancel the shadows first
        with ``shadow.cancel_all`` not to wait for them)."""
        while self._background or self.shadow.running:
            await asyncio.gather(*list(self._background), return_exceptions=True)
            await self.shadow.drain()
