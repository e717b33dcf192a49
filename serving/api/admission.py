"""What every route shares: the gateway of the app's runtime (a 503 while it loads), the caller's key, and the
way a completion request is admitted (key, rate, body, parse, prepare; a refusal leaves a request-log row) and
answered (non-streaming until the client leaves, or as server-sent events).

    gw = gateway(request)
    req, call = await admit(request, gw, gw.parse, gw.prepare)
    return sse(chat.sse(gw, call), call.headers()) if req.stream else await answer(request, gw, [call], ...)
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

import anyio
from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from serving.api.body import read_json
from serving.pipeline.call import Call
from serving.pipeline.gateway import Gateway
from serving.wire.errors import APIError, bad_request, unavailable

if TYPE_CHECKING:
    from serving.runtime import GatewayRuntime

R = TypeVar("R")  # a parsed request
P = TypeVar("P")  # what preparing it gives


def runtime(request: Request) -> GatewayRuntime:
    """The runtime ``create_app`` put on the app's state."""
    found: GatewayRuntime = request.app.state.runtime
    return found


def gateway(request: Request) -> Gateway:
    """The runtime's gateway, or a 503 (with ``Retry-After``) while the engines are still loading."""
    rt = runtime(request)
    if not rt.loaded:
        raise unavailable(
            "The gateway is still loading its engines; retry shortly (GET /readyz)",
            rt.spec.serving.limits.retry_after_s,
        )
    return rt.gateway


def sse(events: Any, headers: dict[str, str]) -> StreamingResponse:
    return StreamingResponse(
        events,
        media_type="text/event-stream",
        headers={**headers, "cache-control": "no-cache", "x-accel-buffering": "no"},
    )


async def admit(
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


async def answer(request: Request, gw: Gateway, calls: list[Call], work: Any, headers: dict[str, str]) -> Response:
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


async def tenant(gw: Gateway, request: Request) -> Any:
    key = await gw.authenticate(request.headers.get("authorization"))
    if key is None:
        raise bad_request("This route needs an API key (serving.api_keys.required is off, so there is no tenant)")
    return key


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
