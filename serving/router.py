"""Which engine answers a request: model names to registered versions to loaded engines.

Names a client may send (``GET /v1/models`` lists them):

    chat                 the served name: the version behind ``routing.primary_alias`` (champion)
    chat@challenger      any alias of the registered model
    chat/3               one version

Versions come from the MLflow registry (``serving -> registry``); aliases are re-read by ``refresh`` (the gateway
calls it on a short timer), so an alias moved in the registry UI changes what answers without a restart.
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
from typing import Protocol

from core.errors import LifecycleError, NotFoundError
from registry.store import ModelVersion, parse_ref
from serving.config import RoutingConfig
from serving.engine import Adapter, Engine

log = logging.getLogger("lifecycle.serving")


class VersionSource(Protocol):
    """What serving needs of the registry (``registry.store.MlflowRegistry`` implements it)."""

    def parse(self, ref: str) -> ModelVersion: ...

    def resolve(self, ref: str) -> Path: ...


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
    model: ServedModel
    fallback: ServedModel | None
    follows_alias: bool  # alias routes fail over to the fallback; a pinned NAME/VERSION does not


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

    # --- loading (blocking: engines take ~30 s to start on CPU) -------------------------------------------

    def load_configured(self) -> None:
        """Load the primary alias, the fallback and the extra versions the config names."""

        primary = f"{self.model_name}@{self.routing.primary_alias}"
        with ThreadPoolExecutor(2) as pool:  # two engines start faster side by side than one after the other
            first = pool.submit(self.load, primary)
            if self.routing.fallback:
                self._fallback = pool.submit(self.load, self.routing.fallback, dedicated=True).result()
            first.result()
        for ref in self.routing.extra:
            self.load(ref)

    def load(self, ref: str, *, dedicated: bool = False) -> ServedModel:
        mv = self.registry.parse(ref)
        _, alias, _ = parse_ref(ref)
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
        engine = self.factory(key, self.registry.resolve(ref), lora)
        with self._lock:
            self._engines[key] = engine
        return engine

    def refresh(self) -> list[str]:
        """Re-read the aliases in use; load versions they now point at. Returns what changed."""
        changed = []
        for alias, version in list(self._aliases.items()):
            try:
                now = self.registry.parse(f"{self.model_name}@{alias}").version
            except NotFoundError:
                if alias != self.routing.primary_alias:
                    with self._lock:
                        self._aliases.pop(alias, None)
                    changed.append(f"{alias}: removed")
                continue
            if now != version:
                ref = f"{self.model_name}@{alias}"
                if ref == self.routing.fallback:  # the fallback follows its alias, on an engine of its own
                    self._fallback = self.load(ref, dedicated=True)
                else:
                    self.load(ref)
                changed.append(f"{alias}: {version} -> {now}")
        return changed

    # --- routing (fast, no registry calls for loaded names) -----------------------------------------------

    def route(self, model: str) -> Route:
        if model == self.routing.served_name:
            return Route(self._by_alias(self.routing.primary_alias), self._fallback, True)
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

    def _by_alias(self, alias: str) -> ServedModel:
        with self._lock:
            version = self._aliases.get(alias)
            served = self._versions.get(f"{self.model_name}/{version}") if version else None
        if served is None:
            raise NotFoundError(f"no version of {self.model_name!r} has the alias {alias!r}")
        return served.via(alias)

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
        for engine in self.engines().values():
            engine.shutdown()


def _identity(mv: ModelVersion) -> str:
    return mv.lineage.get("weights_hash") or mv.ref
