"""A gateway on fakes for the HTTP tests: ``GatewayRuntime`` with a ``FakeRegistry``, ``FakeEngine``s and a fake
toxicity scorer, its SQLite store under ``tmp_path``, driven in-process through httpx's ASGI transport. Tests get
one from the ``make_harness`` fixture (conftest.py).

The registry the harness builds (model ``chat``):

    chat-base/1   full base model
    chat/1        LoRA on chat-base/1    alias previous-champion   (the fallback: a dedicated engine)
    chat/2        LoRA on chat-base/1    alias champion            (the primary: the shared base engine)
    chat/3        full fine-tune         no alias, not loaded      (would need an engine of its own)
    chat/4        LoRA on chat-base/1    alias canary              (loaded on demand on the shared engine)

Rollout tests give chat/4 or chat/3 the challenger or shadow alias (``registry.set_alias``, ``set_weight``) and
call ``runtime.gateway.router.refresh()``; comparisons use a ``FakeEmbedder`` (``Harness.embedder``).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from unit.serving.fakes import FakeEmbedder, FakeEngine, FakeFactory, FakeRegistry, FakeScorer

from registry.config import RegistryConfig
from serving.api.app import create_app
from serving.config import ServingConfig
from serving.runtime import GatewayRuntime, ServeSpec
from serving.safety.filters import SafetyFilters
from serving.state.store import ApiKey, RequestLogEntry

BAD = "hunter2-launch-code"  # a string the post-filter must never let through
BAD_PATTERNS = [r"hunter2-launch-code", r"sk-live-[0-9]{6}"]
PRIMARY_KEY = "lora:w-chat-base-1"
FALLBACK_KEY = "lora:w-chat-base-1#chat/1"


def registry_with_versions(root: Path) -> FakeRegistry:
    registry = FakeRegistry(root)
    registry.add_full("chat-base", "1")
    registry.add_lora("chat", "1", base="chat-base/1", aliases=("previous-champion",))
    registry.add_lora("chat", "2", base="chat-base/1", aliases=("champion",))
    registry.add_full("chat", "3")
    registry.add_lora("chat", "4", base="chat-base/1", aliases=("canary",))
    return registry


def merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


DEFAULTS: dict[str, Any] = {
    "routing": {"fallback": "chat@previous-champion"},
    "safety": {"blocked_output_patterns": BAD_PATTERNS},
}


@dataclass
class Harness:
    runtime: GatewayRuntime
    registry: FakeRegistry
    factory: FakeFactory
    scorer: FakeScorer
    embedder: FakeEmbedder
    key: ApiKey
    secret: str
    other_key: ApiKey
    other_secret: str
    raise_app_exceptions: bool = True

    @property
    def cfg(self) -> ServingConfig:
        return self.runtime.spec.serving

    @property
    def primary(self) -> FakeEngine:
        return self.factory.engines[PRIMARY_KEY]

    @property
    def fallback(self) -> FakeEngine:
        return self.factory.engines[FALLBACK_KEY]

    def engines(self) -> list[FakeEngine]:
        return list(self.factory.engines.values())

    def client(self) -> httpx.AsyncClient:
        transport = httpx.ASGITransport(create_app(self.runtime), raise_app_exceptions=self.raise_app_exceptions)
        return httpx.AsyncClient(transport=transport, base_url="http://gateway")

    def auth(self, secret: str | None = None) -> dict[str, str]:
        return {"authorization": f"Bearer {secret or self.secret}"}

    async def chat(
        self,
        content: str = "hello there",
        *,
        model: str = "chat",
        secret: str | None = None,
        messages: list[dict[str, str]] | None = None,
        **body: Any,
    ) -> httpx.Response:
        payload = {"model": model, "messages": messages or [{"role": "user", "content": content}], **body}
        async with self.client() as c:
            return await c.post("/v1/chat/completions", json=payload, headers=self.auth(secret))

    async def request(self, method: str, path: str, *, secret: str | None = None, **kwargs: Any) -> httpx.Response:
        async with self.client() as c:
            return await c.request(method, path, headers=self.auth(secret), **kwargs)

    async def log(self) -> list[RequestLogEntry]:
        """The request log once every background record write has finished."""
        await self.runtime.gateway.drain()
        return self.runtime.gateway.store.request_log()


def sse_events(response: httpx.Response) -> list[Any]:
    """The ``data:`` payloads of an SSE body, parsed (``[DONE]`` stays a string); every event must be one
    ``data: ...`` line followed by a blank line."""
    text = response.text
    assert text.endswith("\n\n"), text[-80:]
    events = []
    for block in text.split("\n\n")[:-1]:
        assert block.startswith("data: ") and "\n" not in block, block
        data = block.removeprefix("data: ")
        events.append(data if data == "[DONE]" else json.loads(data))
    return events


def streamed_text(events: list[Any]) -> str:
    return "".join(
        e["choices"][0]["delta"].get("content", "") for e in events if isinstance(e, dict) and e.get("choices")
    )


def reply_text(response: httpx.Response) -> str:
    """The assistant text of a response, streamed or not."""
    if response.headers["content-type"].startswith("text/event-stream"):
        return streamed_text(sse_events(response))
    return response.json()["choices"][0]["message"]["content"]


def finish_reason(response: httpx.Response) -> str | None:
    if response.headers["content-type"].startswith("text/event-stream"):
        finals = [
            e["choices"][0]["finish_reason"]
            for e in sse_events(response)
            if isinstance(e, dict) and e.get("choices") and e["choices"][0]["finish_reason"]
        ]
        assert len(finals) == 1, finals
        return finals[0]
    return response.json()["choices"][0]["finish_reason"]


MakeHarness = Callable[..., Harness]


def build_harness(
    home: Path,
    registry_root: Path,
    serving: dict[str, Any] | None = None,
    *,
    factory: FakeFactory | None = None,
    load: bool = True,
    raise_app_exceptions: bool = True,
) -> Harness:
    """A gateway runtime on fakes with two keys (tenant-a, tenant-b); loaded unless ``load`` is False."""
    cfg = ServingConfig.model_validate(merge(DEFAULTS, serving or {}))
    spec = ServeSpec(home=str(home), serving=cfg, registry=RegistryConfig(), model_name="chat")
    registry = registry_with_versions(registry_root)
    factory = factory or FakeFactory()
    scorer = FakeScorer()
    embedder = FakeEmbedder()
    runtime = GatewayRuntime(
        spec, registry=registry, factory=factory, filters=SafetyFilters(cfg.safety, scorer), embedder=embedder
    )
    if load:
        runtime.load()
        assert runtime.loaded, runtime.load_error
    key, secret = runtime.gateway.store.create_key("tenant-a")
    other, other_secret = runtime.gateway.store.create_key("tenant-b")
    return Harness(runtime, registry, factory, scorer, embedder, key, secret, other, other_secret, raise_app_exceptions)
