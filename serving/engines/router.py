"""Which engine answers a request: model names to registered versions to loaded engines.

Names a client may send (``GET /v1/models`` lists them):

    chat                 the served name: the version behind ``routing.primary_alias`` (champion)
    chat@challenger      any alias of the registered model
    chat/3               one version

Versions come from the MLflow registry (``serving -> registry``). ``refresh`` (the runtime calls it every
``routing.refresh_s``, in a worker thread) reads the registered model's deployment (aliases and the canary weight,
one registry call) and follows it live:

- every alias in use (primary, fallback, ones clients asked for) follows its version;
- the rollout aliases are loaded as they appear: ``challenger`` (the canary: ``Route.canary`` with the weight
  of the ``rollout.weight`` tag) and ``shadow`` (``Route.shadow``: mirrored, never answers a user). An adapter on
  a running base engine loads in milliseconds; a version needing its own engine starts one in the refresh thread
  while the champion keeps serving;
- a version that lost its rollout alias, and is neither primary, fallback nor ``extra``, is retired: out of
  routing at once, its adapter unloaded once no request uses it (``unload_adapters``, on the event loop), its
  engine (when no version is left on it) shut down once idle, checked on later refreshes;
- a version that fails to load leaves its alias where it was (the champion keeps answering); the error is kept
  in ``load_errors`` for /readyz and retried on the next refresh.

A LoRA version is an adapter on its base model's engine (one engine per base weights, adapters loaded on first
use); a full version gets its own engine. The fallback always has an engine of its own, even when it is an
adapter of the primary's base: a fallback that dies with the primary would not be one.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from core.errors import LifecycleError, NotFoundError
from registry.store import Deployment, ModelVersion, parse_ref
from serving.config import RoutingConfig
from serving.engines.engine import Adapter, Engine

log = logging.getLogger("lifecycle.serving")


class VersionSource(Protocol):
    """What serving needs of the registry (``registry.store.MlflowRegistry`` implements it)."""

    def parse(self, ref: str) -> ModelVersion: ...

    def resolve(self, ref: str) -> Path: ...

    def deployment(self, name: str) -> Deployment: ...


EngineFactory = Callable[[str, Path, bool], Engine]  # (key, folder, lora) -> a started engine


@dataclass(frozen=True)
class ServedModel:
    name: str
    version: str
    engine: Engine
    adapter: Adapter | None = None
    alias: str | None = None

    @property
    def ref(self) -> str:
        return f"{self.name}/{self.version}"

    def header(self) -> str:
        """``x-model-version``: registered name/version, and the alias it was reached through."""
        return self.ref + (f"; alias={self.alias}" if self.alias else "")

    def via(self, alias: str | None) -> ServedModel:
        return ServedModel(self.name, self.version, self.engine, self.adapter, alias)


@dataclass(frozen=True)
class Route:
    """What may answer a request. ``canary``, ``canary_weight`` and ``shadow`` are set for the served name only:
    the loaded challenger (it answers ``canary_weight`` percent of the conversations; 0: none) and the loaded
    shadow version (mirrored, never answers)."""

    model: ServedModel
    fallback: ServedModel | None
    follows_alias: bool  # alias routes fail over to the fallback; a pinned NAME/VERSION does not
    canary: ServedModel | None = None
    canary_weight: int = 0
    shadow: ServedModel | None = None


class Router:
    def __init__(
        self, registry: VersionSource, routing: RoutingConfig, model_name: str, factory: EngineFactory
    ) -> None:
        self.registry = registry
        self.routing = routing
        self.model_name = routing.model_name or model_name
        self.factory = factory
        self._lock = threading.RLock()
        self._engines: dict[str, Engine] = {}
        self._versions: dict[str, ServedModel] = {}  # "chat/3" -> loaded version
        self._aliases: dict[str, str] = {}  # "champion" -> "3"
        self._fallback: ServedModel | None = None
        self._adapter_ids = 0
        self._canary_weight = 0
        self._load_errors: dict[str, str] = {}  # alias -> why its new version could not be loaded
        self._extra: set[str] = set()  # versions loaded from routing.extra: never retired
        self._idle: dict[str, Engine] = {}  # retired engines, shut down once no request is in flight
        self._unload_pending: list[tuple[Engine, Adapter]] = []  # retired adapters, due at the next refresh
        self._unload_due: list[tuple[Engine, Adapter]] = []  # unloaded by unload_adapters once unused
        self._closed = False

    # --- loading (blocking: engines take ~30 s to start on CPU) -------------------------------------------

    def load_configured(self) -> None:
        """Load the primary alias, the fallback and the extra versions the config names. The rollout aliases
        come with the first ``refresh`` (the runtime's first supervisor tick): a canary's engine start does not
        delay readiness, and one that fails does not stop the gateway."""

        primary = f"{self.model_name}@{self.routing.primary_alias}"
        with ThreadPoolExecutor(2) as pool:  # two engines start faster side by side than one after the other
            first = pool.submit(self.load, primary)
            if self.routing.fallback:
                self._fallback = pool.submit(self.load, self.routing.fallback, dedicated=True).result()
            first.result()
        for ref in self.routing.extra:
            self._extra.add(self.load(ref).ref)

    def load(self, ref: str, *, dedicated: bool = False) -> ServedModel:
        mv = self.registry.parse(ref)
        _, alias, _ = parse_ref(ref)
        return self._load(mv, alias, dedicated)

    def _load(self, mv: ModelVersion, alias: str | None, dedicated: bool) -> ServedModel:
        key = f"{mv.ref}#dedicated" if dedicated else mv.ref
        with self._lock:
            if key in self._versions:
                if alias:
                    self._aliases[alias] = mv.version
                return self._versions[key].via(alias)
        folder = self.registry.resolve(mv.ref)
        if (folder / "adapter_config.json").is_file():
            base_ref = mv.lineage.get("base_model")
            if not base_ref:
                raise NotFoundError(f"{mv.ref} is a LoRA adapter without a lineage.base_model tag")
            base = self.registry.parse(base_ref)
            engine = self._engine(f"lora:{_identity(base)}" + (f"#{mv.ref}" if dedicated else ""), base_ref, True)
            with self._lock:
                self._adapter_ids += 1
                adapter = Adapter(name=mv.ref, id=self._adapter_ids, path=folder)
        else:
            engine = self._engine(f"full:{_identity(mv)}" + (f"#{mv.ref}" if dedicated else ""), mv.ref, False)
            adapter = None
        served = ServedModel(mv.name, mv.version, engine, adapter)
        with self._lock:
            self._versions[key] = served
            # a pinned NAME/VERSION request for the fallback version uses the fallback's engine
            self._versions.setdefault(mv.ref, served)
            if alias:  # only now: an engine that failed to start leaves the alias on the version that works
                self._aliases[alias] = mv.version
        log.info("serving %s on engine %s%s", mv.ref, engine.key[:24], " (adapter)" if adapter else "")
        return served.via(alias)

    def _engine(self, key: str, ref: str, lora: bool) -> Engine:
        with self._lock:
            if key in self._engines:
                return self._engines[key]
            retired = self._idle.pop(key, None)
            if retired is not None and retired.state == "ready":  # retired, not shut down yet: serve again
                self._engines[key] = retired
                log.info("engine %s is back in service", key[:24])
                return retired
        if retired is not None:
            retired.shutdown()
        engine = self.factory(key, self.registry.resolve(ref), lora)
        with self._lock:
            closed = self._closed
            if not closed:
                self._engines[key] = engine
        if closed:  # the gateway shut down while this engine started (in a refresh thread)
            engine.shutdown()
            raise RuntimeError(f"the router is shut down; engine {key[:24]} stopped again")
        return engine

    # --- following the registry ----------------------------------------------------------------------------

    def refresh(self) -> list[str]:
        """Read the deployment (aliases + canary weight) once and follow it: move the aliases in use, load the
        rollout aliases, retire what lost its rollout alias, shut down retired engines that are idle.
        Returns (and logs) what changed. A version that fails to load is kept in ``load_errors``, not raised."""
        dep = self.registry.deployment(self.model_name)
        r = self.routing
        rollout = (r.challenger_alias, r.shadow_alias)
        fallback_alias = self._fallback_alias()
        changes: list[str] = []
        with self._lock:
            # retired by an earlier refresh: a request routed just before its retirement has reached the engine
            reapable = set(self._idle)
            current = dict(self._aliases)
            self._unload_due += self._unload_pending
            self._unload_pending = []
        held_before = {current[a] for a in rollout if a in current}
        # the primary first: a champion move (a rollback) must not wait behind a canary's engine start
        order = [r.primary_alias, *([fallback_alias] if fallback_alias else [])]
        order += sorted((set(current) | {a for a in rollout if a in dep.aliases}) - set(order))
        for alias in order:
            changes += self._follow(alias, current.get(alias), dep.aliases.get(alias), fallback_alias)
        weight = dep.canary_weight
        with self._lock:
            if weight != self._canary_weight:
                changes.append(f"canary weight: {self._canary_weight}% -> {weight}%")
                self._canary_weight = weight
            keep = set(self._aliases.values()) | {v.split("/")[-1] for v in self._extra}
            if self._fallback is not None:
                keep.add(self._fallback.version)
        for version in sorted(held_before - keep):
            changes += self._retire(f"{self.model_name}/{version}")
        changes += self._reap(reapable)  # after following: an engine needed again was taken back meanwhile
        for change in changes:
            log.info("deployment change: %s", change)
        return changes

    def _follow(self, alias: str, was: str | None, now: str | None, fallback_alias: str | None) -> list[str]:
        if now is None:
            self._load_errors.pop(alias, None)
            if was is None or alias == self.routing.primary_alias:  # the primary keeps answering until moved
                return []
            with self._lock:
                self._aliases.pop(alias, None)
            return [f"{alias}: removed"]
        if now == was:
            self._load_errors.pop(alias, None)
            return []
        changes = []
        try:
            mv = self.registry.parse(f"{self.model_name}/{now}")  # by version: the deployment's snapshot
            if alias == fallback_alias:  # the fallback follows its alias, on an engine of its own
                old = self._fallback
                self._fallback = self._load(mv, alias, dedicated=True)
                if old is not None and old.version != mv.version:
                    changes = self._retire(f"{old.ref}#dedicated")
            else:
                self._load(mv, alias, dedicated=False)
        except Exception as exc:  # the alias stays on the version that works; retried on the next refresh
            message = f"{self.model_name}/{now}: {type(exc).__name__}: {exc}"
            if self._load_errors.get(alias) != message:
                log.exception("loading %s for the alias %r failed", f"{self.model_name}/{now}", alias)
            self._load_errors[alias] = message
            return []
        self._load_errors.pop(alias, None)
        return [f"{alias}: {was or 'none'} -> {now}", *changes]

    def _retire(self, key: str) -> list[str]:
        """Take a loaded version out of routing now; its adapter is unloaded and its engine (when nothing else
        runs on it) shut down later, once the requests already running on it are done."""
        with self._lock:
            served = self._versions.pop(key, None)
            if served is None:
                return []
            plain = key.split("#")[0]
            if self._versions.get(plain) is served:  # the dedicated copy answered pinned requests too
                del self._versions[plain]
            changes = [f"retired {served.ref}" + (" (old fallback)" if key.endswith("#dedicated") else "")]
            engine = served.engine
            in_use = any(s.engine is engine for s in self._versions.values()) or (
                self._fallback is not None and self._fallback.engine is engine
            )
            if in_use:
                if served.adapter is not None:
                    self._unload_pending.append((engine, served.adapter))
            elif self._engines.get(engine.key) is engine:
                del self._engines[engine.key]
                self._idle[engine.key] = engine
                changes.append(f"engine {engine.key[:40]} retired (shut down once idle)")
        return changes

    def _reap(self, keys: set[str]) -> list[str]:
        """Shut down those retired engines with nothing in flight (in the calling thread: vLLM's shutdown
        blocks)."""
        with self._lock:
            idle = [(k, e) for k, e in self._idle.items() if k in keys and e.in_flight == 0]
            for key, _ in idle:
                del self._idle[key]
        changes = []
        for key, engine in idle:
            try:
                engine.shutdown()
            except Exception:
                log.exception("shutting down the retired engine %s failed", key[:24])
            changes.append(f"engine {key[:40]} shut down")
        return changes

    async def unload_adapters(self) -> list[str]:
        """Unload retired adapters that no request uses (on the event loop: vLLM's ``remove_lora`` is a
        coroutine of the engine's loop). One still in use stays due until a later call."""
        with self._lock:
            due = list(self._unload_due)
        changes = []
        for engine, adapter in due:
            if engine.state == "ready" and engine.adapter_in_flight(adapter):
                continue
            if engine.state == "ready":  # a dead or stopped engine has nothing loaded any more
                try:
                    await engine.remove_adapter(adapter)
                    changes.append(f"adapter {adapter.name} unloaded from engine {engine.key[:40]}")
                except Exception:
                    log.exception("unloading adapter %s from engine %s failed", adapter.name, engine.key[:24])
            with self._lock:
                self._unload_due = [d for d in self._unload_due if d != (engine, adapter)]
        for change in changes:
            log.info("deployment change: %s", change)
        return changes

    def _fallback_alias(self) -> str | None:
        if not self.routing.fallback:
            return None
        return parse_ref(self.routing.fallback)[1]

    # --- routing (fast, no registry calls for loaded names) -----------------------------------------------

    def route(self, model: str) -> Route:
        if model == self.routing.served_name:
            with self._lock:
                canary = self._alias_or_none(self.routing.challenger_alias)
                shadow = self._alias_or_none(self.routing.shadow_alias)
                weight = self._canary_weight if canary is not None else 0
            return Route(self._by_alias(self.routing.primary_alias), self._fallback, True, canary, weight, shadow)
        try:
            name, alias, version = parse_ref(model)
        except LifecycleError:
            raise NotFoundError(self._unknown(model)) from None
        if name != self.model_name:
            raise NotFoundError(self._unknown(model))
        if alias:
            with self._lock:
                known = alias in self._aliases
            if not known:
                self._load_on_demand(f"{name}@{alias}")
            return Route(self._by_alias(alias), self._fallback, True)
        with self._lock:
            served = self._versions.get(f"{name}/{version}")
            holding = [a for a, v in self._aliases.items() if v == version]
        if served is None:
            served = self._load_on_demand(f"{name}/{version}")
        return Route(served.via(holding[0] if holding else None), None, False)

    def _alias_or_none(self, alias: str) -> ServedModel | None:
        with self._lock:
            version = self._aliases.get(alias)
            served = self._versions.get(f"{self.model_name}/{version}") if version else None
        return served.via(alias) if served is not None else None

    def _by_alias(self, alias: str) -> ServedModel:
        served = self._alias_or_none(alias)
        if served is None:
            raise NotFoundError(f"no version of {self.model_name!r} has the alias {alias!r}")
        return served

    def _load_on_demand(self, ref: str) -> ServedModel:
        """Adapters on a running base engine load in milliseconds; a version needing a new engine is refused
        (starting one takes ~30 s and memory: list it in serving.routing.extra instead)."""
        try:
            mv = self.registry.parse(ref)
        except NotFoundError:
            raise NotFoundError(self._unknown(ref)) from None
        with self._lock:
            loaded = mv.ref in self._versions
        if loaded:  # a new alias on a version already served
            return self.load(ref)
        folder = self.registry.resolve(mv.ref)
        base_ref = mv.lineage.get("base_model")
        if (folder / "adapter_config.json").is_file() and base_ref:
            base_key = f"lora:{_identity(self.registry.parse(base_ref))}"
            with self._lock:
                running = base_key in self._engines
            if running:
                return self.load(ref)
        raise NotFoundError(
            f"{mv.ref} is registered but not loaded by this gateway (it needs its own engine): "
            "add it to serving.routing.extra"
        )

    def _unknown(self, model: str) -> str:
        return (
            f"The model {model!r} does not exist: use {self.routing.served_name!r}, "
            f"{self.model_name}@ALIAS or {self.model_name}/VERSION (GET /v1/models lists them)"
        )

    # --- views ---------------------------------------------------------------------------------------------

    def models(self) -> list[ServedModel]:
        with self._lock:
            aliases = dict(self._aliases)
            versions = {k: v for k, v in self._versions.items() if "#" not in k}
        by_version = {v: a for a, v in aliases.items()}
        return [served.via(by_version.get(served.version)) for served in versions.values()]

    @property
    def aliases(self) -> dict[str, str]:
        with self._lock:
            return dict(self._aliases)

    @property
    def fallback(self) -> ServedModel | None:
        return self._fallback

    @property
    def canary_weight(self) -> int:
        return self._canary_weight

    @property
    def load_errors(self) -> dict[str, str]:
        """Alias -> why the version it names could not be loaded (the alias stays on the one that works)."""
        with self._lock:
            return dict(self._load_errors)

    def deployment_state(self) -> dict[str, Any]:
        """What this gateway deploys right now (for /readyz): the versions its rollout aliases answer with."""

        def ref(alias: str) -> str | None:
            version = self._aliases.get(alias)
            return f"{self.model_name}/{version}" if version else None

        r = self.routing
        with self._lock:
            return {
                "champion": ref(r.primary_alias),
                "challenger": ref(r.challenger_alias),
                "canary_weight": self._canary_weight if ref(r.challenger_alias) else 0,
                "shadow": ref(r.shadow_alias),
                "fallback": self._fallback.ref if self._fallback else None,
                "load_errors": dict(self._load_errors),
                "retiring_engines": sorted(self._idle),
            }

    def engines(self) -> dict[str, Engine]:
        with self._lock:
            return dict(self._engines)

    def replace_engine(self, key: str, engine: Engine) -> None:
        """Swap a restarted engine in: every version on the old one moves to the new one."""
        with self._lock:
            self._engines[key] = engine
            for k, served in list(self._versions.items()):
                if served.engine.key == key:
                    self._versions[k] = ServedModel(served.name, served.version, engine, served.adapter, served.alias)
            if self._fallback is not None and self._fallback.engine.key == key:
                fb = self._fallback
                self._fallback = ServedModel(fb.name, fb.version, engine, fb.adapter, fb.alias)

    def shutdown(self) -> None:
        with self._lock:
            self._closed = True
            engines = [*self._engines.values(), *self._idle.values()]
            self._idle.clear()
        for engine in engines:
            engine.shutdown()


def _identity(mv: ModelVersion) -> str:
    return mv.lineage.get("weights_hash") or mv.ref
