"""The gateway's outermost layer of its own: request ids, HTTP metrics, error accounting and the last-resort 500.

    app.add_middleware(GatewayMiddleware, metrics=gateway.metrics)    # in serving.api.app.create_app

Plain ASGI rather than ``BaseHTTPMiddleware`` (which would sit between a stream and its disconnect). For every
HTTP request it

- gives the request an id (``scope["state"]["request_id"]``) and every response the ``x-request-id`` header;
- counts it in ``lifecycle_http_requests_total{method,route,status}`` and times it: the route is the matched
  route's *template* (``/v1/conversations/{conversation_id}``), ``unmatched`` for any other path, so a scanner
  trying a thousand paths adds no series;
- counts every 4xx/5xx response in ``lifecycle_errors_total{status,code}`` (the code a handler put in
  ``scope["state"]["error_code"]``, else ``http_<status>``) and logs it with its status, one line;
- answers an exception nothing handled with an OpenAI-shaped 500 carrying the request id, and does *not* re-raise
  it. Starlette's ``ServerErrorMiddleware`` re-raises after answering, and uvicorn then closes the connection, so
  the client's next request on that keep-alive connection failed: here the traceback goes to the log and the
  connection stays usable. A client that left mid-request (``ClientDisconnect``) gets no answer at all.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from typing import Any

from starlette.datastructures import MutableHeaders
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from serving.pipeline.metrics import ServingMetrics
from serving.wire.errors import server_error

log = logging.getLogger("lifecycle.serving")
REQUEST_ID = "x-request-id"
_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
CLIENT_CLOSED = 499  # nginx's status for a request its client abandoned (logged, never sent)


def new_request_id() -> str:
    return f"chatcmpl-{uuid.uuid4().hex[:24]}"


def set_error_code(scope: Scope, code: str) -> None:
    """Name the error a handler answers with, for ``lifecycle_errors_total`` (a fixed vocabulary, never user text)."""
    scope.setdefault("state", {})["error_code"] = code


class GatewayMiddleware:
    def __init__(self, app: ASGIApp, metrics: ServingMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        state = scope.setdefault("state", {})
        rid = state.setdefault("request_id", new_request_id())
        started = time.monotonic()
        status: int | None = None

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
                headers = MutableHeaders(scope=message)
                if REQUEST_ID not in headers:  # a route may have renamed its request (cmpl-... for completions)
                    headers.append(REQUEST_ID, state.get("request_id", rid))
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        except ClientDisconnect:
            status = status or CLIENT_CLOSED
        except Exception:
            log.exception("unhandled error in %s %s (request %s)", scope["method"], scope["path"], rid)
            if status is None:  # nothing sent yet: an answer is still possible
                await _send_error(send_with_id, server_error(state.get("request_id", rid)).body(), 500)
                set_error_code(scope, "internal_error")
            # else: a response already started (a stream); nothing more can be said on it
        finally:
            self._account(scope, status or 500, time.monotonic() - started, rid)

    def _account(self, scope: Scope, status: int, seconds: float, rid: str) -> None:
        route = getattr(scope.get("route"), "path", None) or "unmatched"
        method = scope["method"] if scope["method"] in _METHODS else "OTHER"
        self.metrics.http_requests.labels(method, route, str(status)).inc()
        self.metrics.http_seconds.labels(route).observe(seconds)
        if status >= 400 and status != CLIENT_CLOSED:
            code = scope.get("state", {}).get("error_code") or f"http_{status}"
            self.metrics.errors.labels(str(status), code).inc()
            log.info("%s %s -> %d %s (request %s)", scope["method"], route, status, code, rid)


async def _send_error(send: Send, body: dict[str, Any], status: int) -> None:
    payload = json.dumps(body).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": payload})
