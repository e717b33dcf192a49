"""The FastAPI app: OpenAI routes, our conversation/usage extensions, health, metrics and the web page.

    app = create_app(runtime)       # runtime: serving.runtime.GatewayRuntime (engines load in the background)

Routes (OpenAI's first, then ours, marked as extensions in the OpenAPI tags):
    POST /v1/chat/completions     streaming (SSE) and non-streaming
    GET  /v1/models
    GET  /v1/conversations, GET/DELETE /v1/conversations/{id}     (extension)
    GET  /v1/usage                                                 (extension)
    GET  /healthz /readyz /metrics, GET / (the chat page)

Every response carries ``x-request-id``; answers carry ``x-model-version``. Errors are OpenAI-shaped JSON.
"""

from __future__ import annotations

import logging
import time
from datetime import date
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from starlette.datastructures import MutableHeaders
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from core.errors import NotFoundError
from serving.errors import APIError, bad_request, error_body, not_found, unavailable
from serving.gateway import Gateway, new_request_id

if TYPE_CHECKING:
    from serving.runtime import GatewayRuntime

log = logging.getLogger("lifecycle.serving")
PAGE = Path(__file__).resolve().parent / "web" / "index.html"
REQUEST_ID = "x-request-id"


def create_app(runtime: GatewayRuntime) -> FastAPI:
    app = FastAPI(title="chat-lifecycle gateway", version="1", docs_url="/docs", redoc_url=None)
    app.state.runtime = runtime

    def gateway() -> Gateway:
        if not runtime.loaded:
            raise unavailable("The gateway is still loading its engines; retry shortly (GET /readyz)")
        return runtime.gateway

    app.add_middleware(RequestIdMiddleware)

    @app.exception_handler(APIError)
    async def api_error(request: Request, exc: APIError) -> JSONResponse:
        runtime.gateway.metrics.errors.labels(str(exc.status), exc.code or exc.type).inc()
        return exc.response({REQUEST_ID: getattr(request.state, "request_id", "")})

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0]
        param = ".".join(str(p) for p in first["loc"][1:])
        return JSONResponse(
            error_body(f"Invalid request: {param}: {first['msg']}", "invalid_request_error", "invalid_value", param),
            status_code=422,
        )

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        message = f"{request.method} {request.url.path}: {exc.detail}"
        return JSONResponse(error_body(message, kind, str(exc.status_code)), status_code=exc.status_code)

    @app.exception_handler(Exception)
    async def crash(request: Request, exc: Exception) -> JSONResponse:
        rid = getattr(request.state, "request_id", "")
        log.exception("unhandled error in %s %s (request %s)", request.method, request.url.path, rid)
        body = error_body(f"The server had an error processing request {rid}; it has been logged.", "server_error")
        return JSONResponse(body, status_code=500, headers={REQUEST_ID: rid})

    # --- OpenAI -------------------------------------------------------------------------------------------

    @app.post("/v1/chat/completions", tags=["openai"])
    async def chat_completions(request: Request) -> Response:
        rid = request.state.request_id
        gw = gateway()
        started = time.monotonic()
        key = await gw.authenticate(request.headers.get("authorization"))
        model = "?"
        try:
            gw.check_rate(key)
            req = gw.parse(await request.body())
            model = req.model
            call = await gw.prepare(key, req, rid)
        except APIError as exc:
            await anyio.to_thread.run_sync(gw.log_rejected, rid, key, model, exc, started)
            raise
        headers = call.headers()
        if req.stream:
            return StreamingResponse(
                gw.sse(call),
                media_type="text/event-stream",
                headers={**headers, "cache-control": "no-cache", "x-accel-buffering": "no"},
            )
        try:
            body = await _until_disconnect(request, gw.complete(call))
        finally:
            gw.finish(call)
        if body is None:  # the client left: nothing to send
            return Response(status_code=499, headers=headers)
        return JSONResponse(body, headers=headers)

    @app.get("/v1/models", tags=["openai"])
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

    @app.get("/v1/conversations", tags=["extension"])
    async def list_conversations(request: Request, limit: int = 20, before: str | None = None) -> dict[str, Any]:
        gw = gateway()
        key = await _key(gw, request)
        if not 1 <= limit <= 100:
            raise bad_request("limit must be between 1 and 100", param="limit")
        convs = await anyio.to_thread.run_sync(lambda: gw.store.list_conversations(key.id, limit=limit, before=before))
        return {"object": "list", "data": [_conversation(c, messages=False) for c in convs]}

    @app.get("/v1/conversations/{conversation_id}", tags=["extension"])
    async def get_conversation(request: Request, conversation_id: str) -> dict[str, Any]:
        gw = gateway()
        key = await _key(gw, request)
        try:
            conv = await anyio.to_thread.run_sync(gw.store.get_conversation, key.id, conversation_id)
        except NotFoundError as exc:
            raise not_found(str(exc), code="conversation_not_found") from None
        return _conversation(conv, messages=True)

    @app.delete("/v1/conversations/{conversation_id}", tags=["extension"])
    async def delete_conversation(request: Request, conversation_id: str) -> dict[str, Any]:
        gw = gateway()
        key = await _key(gw, request)
        try:
            await anyio.to_thread.run_sync(gw.store.delete_conversation, key.id, conversation_id)
        except NotFoundError as exc:
            raise not_found(str(exc), code="conversation_not_found") from None
        return {"id": conversation_id, "object": "conversation.deleted", "deleted": True}

    @app.get("/v1/usage", tags=["extension"])
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

    # --- operations ---------------------------------------------------------------------------------------

    @app.get("/healthz", tags=["ops"])
    async def healthz() -> dict[str, str]:
        return {"status": "alive"}

    @app.get("/readyz", tags=["ops"])
    async def readyz() -> JSONResponse:
        status, body = runtime.readiness()
        return JSONResponse(body, status_code=status)

    @app.get("/metrics", tags=["ops"])
    async def metrics() -> Response:
        runtime.update_gauges()
        return Response(runtime.gateway.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    async def page() -> HTMLResponse:
        return HTMLResponse(PAGE.read_text(encoding="utf-8"))

    return app


class RequestIdMiddleware:
    """Give every request an id (``request.state.request_id``) and every response the ``x-request-id`` header.
    Plain ASGI rather than ``BaseHTTPMiddleware``, which would sit between a stream and its disconnect."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        rid = new_request_id()
        scope.setdefault("state", {})["request_id"] = rid

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                if REQUEST_ID not in headers:
                    headers.append(REQUEST_ID, rid)
            await send(message)

        await self.app(scope, receive, send_with_id)


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
