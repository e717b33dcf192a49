"""Operations: ``/healthz`` (alive), ``/readyz`` (engines, fallback and degraded mode, ``GatewayRuntime.readiness``),
``/metrics`` (Prometheus text, optionally behind a bearer token) and ``/``, the chat page (``web/index.html``)."""

from __future__ import annotations

import hmac
import os
from pathlib import Path
from typing import Any

import anyio
from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response

from serving.api.admission import runtime
from serving.wire import openapi, responses
from serving.wire.errors import unauthorized

PAGE = Path(__file__).resolve().parent / "web" / "index.html"

router = APIRouter()


@router.get(
    "/healthz",
    tags=["ops"],
    response_model=None,
    responses=openapi.answers(openapi.Health, {}),
    openapi_extra=openapi.NO_KEY,
)
async def healthz() -> dict[str, Any]:
    return responses.dump(responses.Health(status="alive"))


@router.get(
    "/readyz",
    tags=["ops"],
    response_model=None,
    responses=openapi.answers(
        openapi.Readiness,
        {503: {"model": openapi.Readiness, "description": "Not ready: starting, failed or unavailable"}},
    ),
    openapi_extra=openapi.NO_KEY,
)
async def readyz(request: Request) -> JSONResponse:
    rt = runtime(request)
    status, body = rt.readiness()
    headers = {"Retry-After": str(rt.spec.serving.limits.retry_after_s)} if status == 503 else None
    return JSONResponse(body, status_code=status, headers=headers)


# HEAD answers like GET without a body (load balancers' probes); out of the OpenAPI document, where one operation
# id per function would otherwise appear twice
router.add_api_route("/healthz", healthz, methods=["HEAD"], include_in_schema=False)
router.add_api_route("/readyz", readyz, methods=["HEAD"], include_in_schema=False)


@router.get(
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
    rt = runtime(request)
    token_env = rt.spec.serving.metrics.token_env
    token = os.environ.get(token_env) if token_env else None
    if token_env and not hmac.compare_digest(request.headers.get("authorization") or "", f"Bearer {token}"):
        raise unauthorized(f"/metrics needs 'Authorization: Bearer <token>' (the token in ${token_env})")
    rt.update_gauges()
    text = await anyio.to_thread.run_sync(rt.gateway.metrics.render)
    return Response(text, media_type="text/plain; version=0.0.4; charset=utf-8")


@router.get("/", response_class=HTMLResponse, include_in_schema=False)
async def page() -> HTMLResponse:
    return HTMLResponse(PAGE.read_text(encoding="utf-8"))
