"""The FastAPI app: OpenAI routes, our conversation/usage extensions, health, metrics and the web page.

    app = create_app(runtime)       # runtime: serving.runtime.GatewayRuntime (engines load in the background)

Routes (OpenAI's first, ``serving.api.inference``, then ours, marked as extensions in the OpenAPI tags,
``serving.api.extensions``, then operations, ``serving.api.ops``):
    POST /v1/chat/completions     streaming (SSE) and non-streaming
    POST /v1/completions          text completions with logprobs and echo (serving.api.completions)
    POST /v1/embeddings           sentence embeddings, float or base64 (serving.pipeline.embeddings)
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

from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from pydantic import BaseModel
from starlette.exceptions import HTTPException
from starlette.routing import Match

from serving.api import completions, extensions, feedback, inference, ops
from serving.api.http import GatewayMiddleware, set_error_code
from serving.wire import openapi
from serving.wire.embeddings import EmbeddingRequest
from serving.wire.errors import APIError, error_body
from serving.wire.protocol import ChatCompletionRequest

if TYPE_CHECKING:
    from serving.runtime import GatewayRuntime


def create_app(runtime: GatewayRuntime) -> FastAPI:
    """The gateway's app on ``runtime``: middleware, OpenAI-shaped error handlers, the routers, the OpenAPI document."""
    app = FastAPI(title="chat-lifecycle gateway", version="1", docs_url="/docs", redoc_url=None)
    app.state.runtime = runtime
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

    for routes in (inference.router, extensions.router, ops.router):  # OpenAI's, ours, operations: the document's order
        app.include_router(routes)
    bodies: list[type[BaseModel]] = [
        ChatCompletionRequest,
        completions.CompletionRequest,
        EmbeddingRequest,
        feedback.FeedbackRequest,
    ]
    openapi.install(app, bodies)
    return app


def _methods(app: FastAPI, scope: Any) -> set[str]:
    methods: set[str] = set()
    for route in app.routes:
        if isinstance(route, APIRoute) and route.matches(scope)[0] != Match.NONE:
            methods |= route.methods
    return methods
