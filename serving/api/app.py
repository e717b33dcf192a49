"""The FastAPI app: OpenAI routes, our conversation/usage extensions, health, metrics and the web page.

    app = create_app(runtime)       # runtime: serving.runtime.GatewayRuntime (engines load in the background)

Routes (OpenAI's first, then ours, marked as extensions in the OpenAPI tags):
    POST /v1/chat/completions     streaming (SSE) and non-streaming
    POST /v1/completions          text completions with logprobs and echo (serving.api.completions)
    GET  /v1/models
    GET  /v1/conversations, GET/DELETE /v1/conversations/{id}     (extension)
    GET  /v1/usage                                                 (extension)
    POST /v1/feedback             thumbs up/down on an answer      (extension, serving.api.feedback)
    GET|HEAD /healthz /readyz, GET /metrics, GET / (the chat page)

Every response carries ``x-request-id``; answers carry ``x-model-version``. Errors are OpenAI-shaped JSON with the
right 4xx status for anything a client sent (``serving.wire.errors``), counted and logged by ``serving.api.http``; the
OpenAPI document at ``/openapi.json`` declares every body and every error answer (``serving.wire.openapi``).
"""

from __future__ import annotations

import hmac
import os
import time
from collections.abc import Awaitable, Callable
from datetime import date
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import anyio
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException
from starlette.routing import Match

from core.errors import NotFoundError
from serving.api import chat, completions, feedback
from serving.api.body import read_json
from serving.api.http import REQUEST_ID, GatewayMiddleware, set_error_code
from serving.pipeline.call import Call
from serving.pipeline.gateway import Gateway
from serving.wire import openapi
from serving.wire.errors import APIError, bad_request, error_body, not_found, unauthorized, unavailable
from serving.wire.protocol import ChatCompletionRequest

if TYPE_CHECKING:
    from serving.runtime import GatewayRuntime

PAGE = Path(__file__).resolve().parent / "web" / "index.html"
R = TypeVar("R")  # a parsed request
P = TypeVar("P")  # what preparing it gives


def create_app(runtime: GatewayRuntime) -> FastAPI:
    app = FastAPI(title="chat-lifecycle gateway", version="1", docs_url="/docs", redoc_url=None)
    app.state.runtime = runtime
    cfg = runtime.spec.serving

    def gateway() -> Gateway:
        if not runtime.loaded:
            raise unavailable(
                "The gateway is still loading its engines; retry shortly (GET /readyz)", cfg.limits.retry_after_s
            )
        return runtime.gateway

    app.add_middleware(GatewayMiddleware, metrics=runtime.gateway.metrics)

    @app.exception_handler(APIError)
    async def api_error(request: Request, exc: APIError) -> JSONResponse:
        set_error_code(request.scope, exc.label)
        return exc.response()

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0]
        param = ".".join(str(p) for p in first["loc"][1:])
        set_error_code(request.scope, "invalid_value")
        return JSONResponse(
            error_body(f"Invalid request: {param}: {first['msg']}", "invalid_request_error", "invalid_value", param),
            status_code=422,
        )

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, f"http_{exc.status_code}")
        set_error_code(request.scope, code)
        message = f"{request.method} {request.url.path}: {exc.detail}"
        headers = dict(exc.headers or {})
        if exc.status_code == 405:  # every method of the path, not only the first route's (GET and DELETE of one id)
            headers["Allow"] = ", ".join(sorted(_methods(app, request.scope)))
        return JSONResponse(error_body(message, kind, code), status_code=exc.status_code, headers=headers)

    # --- OpenAI -------------------------------------------------------------------------------------------

    @app.post(
        "/v1/chat/completions",
        tags=["openai"],
        response_model=None,
        responses=openapi.answers(openapi.ChatCompletion, openapi.BODY_ERRORS),
        openapi_extra=openapi.body(ChatCompletionRequest, streams=True),
    )
    async def chat_completions(request: Request) -> Response:
        gw = gateway()
        req, call = await _admit(request, gw, gw.parse, gw.prepare)
        if req.stream:
            return _sse(chat.sse(gw, call), call.headers())
        return await _answer(request, gw, [call], chat.complete(gw, call), call.headers())

    @app.post(
        "/v1/completions",
        tags=["openai"],
        response_model=None,
        responses=openapi.answers(openapi.Completion, openapi.BODY_ERRORS),
        openapi_extra=openapi.body(completions.CompletionRequest, streams=True),
    )
    async def text_completions(request: Request) -> Response:
        request.state.request_id = "cmpl-" + request.state.request_id.split("-", 1)[1]
        gw = gateway()
        req, calls = await _admit(request, gw, partial(completions.parse, gw), partial(completions.prepare, gw))
        headers = {**calls[0].headers(), REQUEST_ID: request.state.request_id}
        if req.stream:
            return _sse(completions.sse(gw, req, calls[0]), headers)
        return await _answer(request, gw, calls, completions.complete(gw, req, calls), headers)

    @app.get(
        "/v1/models",
        tags=["openai"],
        response_model=None,
        responses=openapi.answers(openapi.ModelList, openapi.ROUTE_ERRORS),
    )
    async def models(request: Request) -> dict[str, Any]:
        gw = gateway()
        await gw.authenticate(request.headers.get("authorization"))
        router = gw.router
        created = int(runtime.started_at)
        data = [
            {
                "id": router.routing.served_name,
                "object": "model",
                "created": created,
                "owned_by": "chat-lifecycle",
                "x_model_version": _primary_header(gw),
            }
        ]
        for alias, version in sorted(router.aliases.items()):
            data.append(
                {
                    "id": f"{router.model_name}@{alias}",
                    "object": "model",
                    "created": created,
                    "owned_by": "chat-lifecycle",
                    "x_model_version": f"{router.model_name}/{version}",
                }
            )
        for served in sorted(router.models(), key=lambda s: int(s.version)):
            data.append({"id": served.ref, "object": "model", "created": created, "owned_by": "chat-lifecycle"})
        return {"object": "list", "data": data}

    # --- our extensions -----------------------------------------------------------------------------------

    @app.get(
        "/v1/conversations",
        tags=["extension"],
        response_model=None,
        responses=openapi.answers(openapi.ConversationList, openapi.ROUTE_ERRORS),
    )
    async def list_conversations(request: Request, limit: int = 20, before: str | None = None) -> dict[str, Any]:
        gw = gateway()
        key = await _key(gw, request)
        if not 1 <= limit <= 100:
            raise bad_request("limit must be between 1 and 100", param="limit")
        try:
            convs = await anyio.to_thread.run_sync(
                lambda: gw.store.list_conversations(key.id, limit=limit, before=before)
            )
        except NotFoundError:  # a cursor that is not one of this key's conversations (another key's looks the same)
            raise bad_request(
                f"before must be the id of one of your conversations (the last of the previous page), got {before!r}",
                code="invalid_cursor",
                param="before",
            ) from None
        return {"object": "list", "data": [_conversation(c, messages=False) for c in convs]}

    @app.get(
        "/v1/conversations/{conversation_id}",
        tags=["extension"],
        response_model=None,
        responses=openapi.answers(openapi.ConversationOut, openapi.ROUTE_ERRORS),
    )
    async def get_conversation(request: Request, conversation_id: str) -> dict[str, Any]:
        gw = gateway()
        key = await _key(gw, request)
        try:
            conv = await anyio.to_thread.run_sync(gw.store.get_conversation, key.id, conversation_id)
        except NotFoundError as exc:
            raise not_found(str(exc), code="conversation_not_found") from None
        return _conversation(conv, messages=True)

    @app.delete(
        "/v1/conversations/{conversation_id}",
        tags=["extension"],
        response_model=None,
        responses=openapi.answers(openapi.ConversationDeleted, openapi.ROUTE_ERRORS),
    )
    async def delete_conversation(request: Request, conversation_id: str) -> dict[str, Any]:
        gw = gateway()
        key = await _key(gw, request)
        try:
            await anyio.to_thread.run_sync(gw.store.delete_conversation, key.id, conversation_id)
        except NotFoundError as exc:
            raise not_found(str(exc), code="conversation_not_found") from None
        return {"id": conversation_id, "object": "conversation.deleted", "deleted": True}

    @app.get(
        "/v1/usage",
        tags=["extension"],
        response_model=None,
        responses=openapi.answers(openapi.UsageList, openapi.ROUTE_ERRORS),
    )
    async def usage(request: Request, start: str | None = None, end: str | None = None) -> dict[str, Any]:
        gw = gateway()
        key = await _key(gw, request)
        first, last = _day(start, "start"), _day(end, "end")
        rows = await anyio.to_thread.run_sync(lambda: gw.store.usage(key.id, first, last))
        data = [
            {
                "date": r.day.isoformat(),
                "model": r.model,
                "requests": r.requests,
                "prompt_tokens": r.prompt_tokens,
                "completion_tokens": r.completion_tokens,
                "total_tokens": r.prompt_tokens + r.completion_tokens,
            }
            for r in rows
        ]
        return {"object": "list", "key_id": key.id, "data": data}

    @app.post(
        "/v1/feedback",
        tags=["extension"],
        response_model=None,
        responses=openapi.answers(openapi.FeedbackOut, openapi.FEEDBACK_ERRORS),
        openapi_extra=openapi.body(feedback.FeedbackRequest, streams=False),
    )
    async def rate(request: Request) -> dict[str, Any]:
        gw = gateway()
        key = await _key(gw, request)
        gw.check_rate(key)
        req = feedback.parse(await read_json(request, gw.cfg.limits), gw.cfg.limits)
        return await feedback.submit(gw, key, req)

    # --- operations ---------------------------------------------------------------------------------------

    @app.api_route(
        "/healthz",
        methods=["GET", "HEAD"],
        tags=["ops"],
        response_model=None,
        responses=openapi.answers(openapi.Health, {}),
        openapi_extra=openapi.NO_KEY,
    )
    async def healthz() -> dict[str, str]:
        return {"status": "alive"}

    @app.api_route(
        "/readyz",
        methods=["GET", "HEAD"],
        tags=["ops"],
        response_model=None,
        responses=openapi.answers(
            openapi.Readiness,
            {503: {"model": openapi.Readiness, "description": "Not ready: starting, failed or unavailable"}},
        ),
        openapi_extra=openapi.NO_KEY,
    )
    async def readyz() -> JSONResponse:
        status, body = runtime.readiness()
        headers = {"Retry-After": str(cfg.limits.retry_after_s)} if status == 503 else None
        return JSONResponse(body, status_code=status, headers=headers)

    @app.get(
        "/metrics",
        tags=["ops"],
        response_class=Response,
        responses={
            200: {"content": {"text/plain": {"schema": {"type": "string"}}}, "description": "Prometheus text"},
            401: openapi.CLIENT_ERRORS[401],
        },
        openapi_extra=openapi.OPTIONAL_KEY,  # serving.metrics.token_env decides
    )
    async def metrics(request: Request) -> Response:
        token_env = cfg.metrics.token_env
        token = os.environ.get(token_env) if token_env else None
        if token_env and not hmac.compare_digest(request.headers.get("authorization") or "", f"Bearer {token}"):
            raise unauthorized(f"/metrics needs 'Authorization: Bearer <token>' (the token in ${token_env})")
        runtime.update_gauges()
        text = await anyio.to_thread.run_sync(runtime.gateway.metrics.render)
        return Response(text, media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    async def page() -> HTMLResponse:
        return HTMLResponse(PAGE.read_text(encoding="utf-8"))

    openapi.install(app, [ChatCompletionRequest, completions.CompletionRequest, feedback.FeedbackRequest])
    return app


def _methods(app: FastAPI, scope: Any) -> set[str]:
    methods: set[str] = set()
    for route in app.routes:
        if isinstance(route, APIRoute) and route.matches(scope)[0] != Match.NONE:
            methods |= route.methods
    return methods


def _sse(events: Any, headers: dict[str, str]) -> StreamingResponse:
    return StreamingResponse(
        events,
        media_type="text/event-stream",
        headers={**headers, "cache-control": "no-cache", "x-accel-buffering": "no"},
    )


async def _admit(
    request: Request,
    gw: Gateway,
    parse: Callable[[dict[str, Any]], R],
    prepare: Callable[[Any, R, str], Awaitable[P]],
) -> tuple[R, P]:
    """Key, rate, body, parse and prepare, in that order; a refusal on the way leaves a request-log row."""
    rid = request.state.request_id
    started = time.monotonic()
    key = await gw.authenticate(request.headers.get("authorization"))
    model = "?"
    try:
        gw.check_rate(key)
        req = parse(await read_json(request, gw.cfg.limits))
        model = getattr(req, "model", model)
        return req, await prepare(key, req, rid)
    except APIError as exc:
        await anyio.to_thread.run_sync(gw.log_rejected, rid, key, model, exc, started)
        raise


async def _answer(request: Request, gw: Gateway, calls: list[Call], work: Any, headers: dict[str, str]) -> Response:
    """A non-streaming answer, or a 499 nobody reads when the client left first (its engine requests are then
    aborted). Every call is recorded once, with the status its client was told."""
    try:
        body = await _until_disconnect(request, work)
        if body is not None:  # recorded before the client has its answer (a replica may die right after)
            for call in calls:
                await gw.settle(call)
        return JSONResponse(body, headers=headers) if body is not None else Response(status_code=499, headers=headers)
    except APIError as exc:
        for call in calls:
            call.status, call.http_status = "error", exc.status
        raise
    except Exception as exc:
        for call in calls:
            gw.crashed(call, exc)
            call.http_status = 500
        raise
    finally:
        for call in calls:
            gw.finish(call)


async def _key(gw: Gateway, request: Request) -> Any:
    key = await gw.authenticate(request.headers.get("authorization"))
    if key is None:
        raise bad_request("This route needs an API key (serving.api_keys.required is off, so there is no tenant)")
    return key


def _day(value: str | None, param: str) -> date | None:
    if value is None:
        return None
    try:
        return date.fromisoformat(value)
    except ValueError:
        raise bad_request(f"{param} must be a date like 2026-11-21, got {value!r}", param=param) from None


def _conversation(conv: Any, *, messages: bool) -> dict[str, Any]:
    out: dict[str, Any] = {
        "id": conv.id,
        "object": "conversation",
        "created": int(conv.created_at.timestamp()),
        "model": conv.model,
    }
    if messages:
        out["messages"] = [
            {k: (v.isoformat() if hasattr(v, "isoformat") else v) for k, v in m.items()} for m in conv.messages
        ]
    return out


def _primary_header(gw: Gateway) -> str | None:
    try:
        return gw.router.route(gw.router.routing.served_name).model.header()
    except NotFoundError:
        return None


async def _until_disconnect(request: Request, work: Any) -> Any:
    """Run ``work`` until it finishes or the client disconnects (then it is cancelled, which aborts the engine
    request inside it); returns None in the second case."""
    result: list[Any] = []
    failed: list[BaseException] = []

    async def run(scope: anyio.CancelScope) -> None:
        try:
            result.append(await work)
        except Exception as exc:  # raised after the task group, so handlers see it and not an ExceptionGroup
            failed.append(exc)
        scope.cancel()

    async def watch(scope: anyio.CancelScope) -> None:
        while True:
            message = await request.receive()
            if message["type"] == "http.disconnect":
                scope.cancel()
                return

    async with anyio.create_task_group() as tg:
        tg.start_soon(run, tg.cancel_scope)
        tg.start_soon(watch, tg.cancel_scope)
    if failed:
        raise failed[0]
    return result[0] if result else None
