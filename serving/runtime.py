"""The gateway's runtime: built from a ``ServeSpec``, loads engines in the background, keeps them healthy.

``lifecycle serve`` resolves the root config and writes a ``ServeSpec`` (home folder, ``serving:`` and
``registry:`` sections) as JSON; the BentoML service reads it from ``$LIFECYCLE_SERVE_SPEC``. So the serving
package never imports ``flows`` and a deployment can hand the service its spec file directly.

Background duties (``supervise``, every ``SUPERVISE_S``): follow the registry's deployment (aliases and canary
weight, re-read every ``serving.routing.refresh_s`` by ``Router.refresh`` in a background task of its own, so an
engine start for a new canary delays neither requests nor the other duties; then retired adapters are unloaded),
restart dead engines (requests meanwhile go to the fallback; /readyz says "degraded"), purge deleted
conversations past retention, update the gauges. ``stop`` cancels the refresh and the shadow requests.
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import anyio
from pydantic import Field

from core import runtime as process_runtime
from core.config import StrictModel
from core.home import Home
from registry.config import RegistryConfig
from registry.store import MlflowRegistry
from serving.config import ServingConfig
from serving.engines.engine import Engine, VllmEngine, engine_label
from serving.engines.router import EngineFactory, Router, VersionSource
from serving.pipeline.gateway import Gateway
from serving.pipeline.limits import RateLimiter
from serving.pipeline.shadow import TokenizingEmbedder
from serving.safety.filters import SafetyFilters, build_filters
from serving.state.review import ReviewQueue
from serving.state.store import ServingStore

log = logging.getLogger("lifecycle.serving")
SUPERVISE_S = 2.0
PURGE_EVERY_S = 3600.0
SPEC_ENV = "LIFECYCLE_SERVE_SPEC"


class ServeSpec(StrictModel):
    home: str = Field(description="The home folder (state, caches, the SQLite registry by default).")
    serving: ServingConfig = Field(description="The serving section of the root config.")
    registry: RegistryConfig = Field(description="Where the MLflow registry is.")
    model_name: str = Field(description="Registered model served (registry.model_name unless overridden).")

    @classmethod
    def read(cls, path: Path) -> ServeSpec:
        return cls.model_validate_json(path.read_text(encoding="utf-8"))


def database_url(spec: ServeSpec) -> str:
    if spec.serving.database_url:
        return spec.serving.database_url
    folder = Home(Path(spec.home)).serving
    folder.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{folder / 'serving.db'}"


class GatewayRuntime:
    def __init__(
        self,
        spec: ServeSpec,
        *,
        registry: VersionSource | None = None,
        factory: EngineFactory | None = None,
        filters: SafetyFilters | None = None,
        embedder: TokenizingEmbedder | None = None,
    ) -> None:
        home = Home(Path(spec.home))
        process_runtime.configure(home)
        if registry is None:
            registry = MlflowRegistry(spec.registry, home)
        self.spec = spec
        self.factory = factory or self._vllm_factory
        router = Router(registry, spec.serving.routing, spec.model_name, self.factory)
        self.gateway = Gateway(
            spec.serving,
            router,
            ServingStore(database_url(spec)),
            RateLimiter(spec.serving.api_keys.storage_uri),
            filters or build_filters(spec.serving.safety, registry),
            embedder=embedder,
            review=ReviewQueue(home.serving / "review.jsonl"),
        )
        self.started_at = time.time()
        self.loaded = False
        self.load_error: str | None = None
        self._restarting: set[str] = set()
        self._last_refresh = -math.inf  # the first tick after loading follows the registry at once
        self._refreshing: asyncio.Task[None] | None = None
        self._last_purge = 0.0

    def _vllm_factory(self, key: str, folder: Path, lora: bool) -> Engine:
        return VllmEngine(key, folder, self.spec.serving.engine, lora=lora).start()

    # --- loading ------------------------------------------------------------------------------------------

    def load(self) -> None:
        """Load the configured versions (blocking). Errors are kept for /readyz rather than killing the server,
        so an operator sees why it is not ready."""
        try:
            self.gateway.filters.refresh()
            self.gateway.router.load_configured()
            self.loaded = True
            log.info("gateway ready: %s", ", ".join(s.header() for s in self.gateway.router.models()))
        except Exception as exc:
            self.load_error = f"{type(exc).__name__}: {exc}"
            log.exception("loading the served versions failed")

    def load_in_background(self) -> threading.Thread:
        thread = threading.Thread(target=self.load, name="gateway-load", daemon=True)
        thread.start()
        return thread

    # --- health -------------------------------------------------------------------------------------------

    def readiness(self) -> tuple[int, dict[str, Any]]:
        router = self.gateway.router
        engines = {
            key: {
                "state": e.state,
                "queue_depth": e.queue_depth,
                "in_flight": e.in_flight,
                "pids": getattr(e, "pids", []),
            }
            for key, e in router.engines().items()
        }
        if not self.loaded:
            status = "failed" if self.load_error else "starting"
            return 503, {"status": status, "error": self.load_error, "engines": engines}
        served = router.routing.served_name
        deployment = router.deployment_state()
        try:
            primary = router.route(served).model
        except Exception as exc:  # the primary alias was removed in the registry
            return 503, {"status": "unavailable", "error": str(exc), "engines": engines, "deployment": deployment}
        fallback = router.fallback
        body: dict[str, Any] = {
            "primary": primary.header(),
            "fallback": fallback.header() if fallback else None,
            "engines": engines,
            "deployment": deployment,
            "safety": self.gateway.filters.states(),
        }
        if primary.engine.state == "ready":
            return 200, {"status": "ready", **body}
        if fallback is not None and fallback.engine.state == "ready":
            reason = f"{primary.ref}'s engine is {primary.engine.state}; {served!r} is answered by {fallback.ref}"
            return 200, {"status": "degraded", "reason": reason, **body}
        return 503, {"status": "unavailable", "reason": f"{primary.ref}'s engine is {primary.engine.state}", **body}

    def update_gauges(self) -> None:
        m = self.gateway.metrics
        for key, engine in self.gateway.router.engines().items():
            label = engine_label(key)
            m.queue_depth.labels(label).set(engine.queue_depth)
            m.in_flight.labels(label).set(engine.in_flight)
            m.engine_up.labels(label).set(1 if engine.state == "ready" else 0)
        m.canary_weight.set(self.gateway.router.deployment_state()["canary_weight"])

    # --- supervision --------------------------------------------------------------------------------------

    async def supervise(self) -> None:
        """Run until cancelled (the app's lifespan starts it)."""
        while True:
            await asyncio.sleep(SUPERVISE_S)
            try:
                await self._tick()
            except Exception:
                log.exception("supervisor tick failed")

    async def _tick(self) -> None:
        self.update_gauges()
        if not self.loaded:
            return
        now = time.monotonic()
        router = self.gateway.router
        for key, engine in router.engines().items():
            if engine.state == "dead" and key not in self._restarting:
                self._restarting.add(key)
                asyncio.get_running_loop().create_task(self._restart(key, engine))
        refreshing = self._refreshing is not None and not self._refreshing.done()
        if not refreshing and now - self._last_refresh >= self.spec.serving.routing.refresh_s:
            self._last_refresh = now
            self._refreshing = asyncio.get_running_loop().create_task(self._refresh())
        if now - self._last_purge >= PURGE_EVERY_S:
            self._last_purge = now
            days = self.spec.serving.retention_days
            purged = await anyio.to_thread.run_sync(lambda: self.gateway.store.purge_deleted(timedelta(days=days)))
            if purged:
                log.info("purged %d deleted conversation(s) older than %s days", purged, days)

    async def _refresh(self) -> None:
        """Follow the registry (the router logs each change); a failure is logged and retried next time."""
        router = self.gateway.router
        try:
            # the safety classifier (and its canary) follow their aliases too
            await anyio.to_thread.run_sync(self.gateway.filters.refresh)
            await anyio.to_thread.run_sync(router.refresh)
            await router.unload_adapters()
        except Exception:
            log.exception("following the registry's deployment failed; retrying in %s s", router.routing.refresh_s)

    async def _restart(self, key: str, dead: Engine) -> None:
        log.warning("engine %s died; restarting it (requests go to the fallback meanwhile)", key[:24])
        try:
            folder = getattr(dead, "folder", None)
            lora = bool(getattr(dead, "lora", False))
            assert folder is not None, "engines built by the factory keep their folder"
            await anyio.to_thread.run_sync(dead.shutdown)
            engine = await anyio.to_thread.run_sync(self.factory, key, folder, lora)
            self.gateway.router.replace_engine(key, engine)
            log.info("engine %s restarted", key[:24])
        except Exception:
            log.exception("restarting engine %s failed; will retry", key[:24])
            await asyncio.sleep(10)
        finally:
            self._restarting.discard(key)

    async def stop(self) -> None:
        """Stop the background work on the event loop: the refresh task (an engine start already running in its
        thread finishes and is shut down by the router), the shadow requests (aborted), the record writes (waited
        for). Then call ``shutdown``."""
        if self._refreshing is not None:
            self._refreshing.cancel()
        await self.gateway.shadow.cancel_all()
        await self.gateway.drain()

    def shutdown(self) -> None:
        self.gateway.router.shutdown()
        self.gateway.store.close()
