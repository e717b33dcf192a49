"""The BentoML service: our FastAPI gateway mounted with ``@bentoml.asgi_app``, engines in the worker process.

    LIFECYCLE_SERVE_SPEC=spec.json bentoml serve serving.service:ChatGateway --host 127.0.0.1 --port 3000

(``lifecycle serve`` writes the spec and runs exactly this.) One worker: the vLLM engines live in it, and
continuous batching, not worker processes, is what serves concurrent requests.

BentoML answers ``/healthz`` and ``/readyz`` itself, before mounted apps. ``OpsRoutes`` hands them to the gateway,
whose readiness knows engines, fallback and degraded mode (BentoML's only knows a bool). BentoML's own metrics are
switched off: they label requests with the raw path (every path a scanner tries became a series), and under its
multiprocess mode they repeated the gateway's families; ``GET /metrics`` is the gateway's
(``serving.pipeline.metrics``).

The worker dies with the server: BentoML starts it in a session of its own, so a ``kill -9`` of ``lifecycle
serve`` (which takes ``bentoml serve`` with it: ``core.process.dying_with_parent``) would leave the worker and its
vLLM engine cores holding the port. ``exit_with_parent`` in the worker kills its process group, engines
included, as soon as it is orphaned.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
from pathlib import Path

import bentoml
from starlette.types import ASGIApp, Receive, Scope, Send

from core.process import exit_with_parent
from serving.api.app import create_app
from serving.runtime import SPEC_ENV, GatewayRuntime, ServeSpec
from serving.wire.errors import error_body

_OPS_PATHS = ("/readyz", "/healthz")
# Starlette's Mount matches its path with "/.*", which fails on a newline (a %0A in a path parameter): BentoML would
# answer such a request itself, with a plain-text 404. The gateway's own router answers it, OpenAI-shaped.
_MOUNTABLE = re.compile(r"/.*")


class _Deferred:
    """The mounted ASGI app. BentoML needs it at import time; the gateway exists only once the service instance
    is created in the worker (no engines or databases at import)."""

    def __init__(self) -> None:
        self.target: ASGIApp | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":  # BentoML drives the service lifecycle through on_startup/on_shutdown
            return
        if self.target is None:
            body = json.dumps(
                error_body("The gateway is starting; retry shortly (GET /readyz)", "service_unavailable", "starting")
            ).encode()
            headers = [(b"content-type", b"application/json"), (b"retry-after", b"5")]
            await send({"type": "http.response.start", "status": 503, "headers": headers})
            await send({"type": "http.response.body", "body": body})
            return
        await self.target(scope, receive, send)


gateway_app = _Deferred()


class OpsRoutes:
    """ASGI middleware: health and readiness come from the gateway, not from BentoML's system routes; so does the
    answer to a path BentoML's mount cannot match."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] == "http"
            and gateway_app.target is not None
            and (scope["path"] in _OPS_PATHS or not _MOUNTABLE.fullmatch(scope["path"]))
        ):
            await gateway_app(scope, receive, send)
            return
        await self.app(scope, receive, send)


@bentoml.asgi_app(gateway_app, path="/")
@bentoml.service(name="chat-gateway", workers=1, traffic={"timeout": 3600}, metrics={"enabled": False})
class ChatGateway:
    def __init__(self) -> None:
        exit_with_parent()  # before any engine is forked: each inherits the watch
        spec_path = os.environ.get(SPEC_ENV)
        if not spec_path:
            raise RuntimeError(f"{SPEC_ENV} is not set: start the gateway with `lifecycle serve`")
        self.runtime = GatewayRuntime(ServeSpec.read(Path(spec_path)))
        gateway_app.target = create_app(self.runtime)
        self.runtime.load_in_background()
        self._supervisor: asyncio.Task[None] | None = None

    @bentoml.on_startup
    async def _start_supervisor(self) -> None:
        self._supervisor = asyncio.get_running_loop().create_task(self.runtime.supervise())

    @bentoml.on_shutdown
    async def _stop(self) -> None:
        if self._supervisor is not None:
            self._supervisor.cancel()
        await self.runtime.stop()
        self.runtime.shutdown()

    def __is_ready__(self) -> bool:
        return self.runtime.readiness()[0] == 200


ChatGateway.add_asgi_middleware(OpsRoutes)  # type: ignore[attr-defined]  # the decorator returns a Service
