"""A gateway that follows a rollout, as the rollout tests drive it (tests/integration/test_rollout.py, and the
poisoned canary in test_gate_scenarios.py).

The controller is ticked by the test (one tick = one analysis interval); between ticks simulated users
(``flows.traffic.replay`` through the openai client) talk to the endpoint, and the gateway follows the registry's
aliases and canary weight live (``serving.routing.refresh_s`` = 1 s here).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from core.config import deep_merge
from core.home import Home
from flows.config import LifecycleConfig

# a demo-scale policy: 5 s analyses, one 50 % canary step, a handful of samples (the tests extend it)
POLICY: dict[str, Any] = {
    "interval_s": 5,
    "steps": [50],
    "shadow_min_samples": 8,
    "min_samples": 16,
    "min_latency_samples": 8,
    "passes_to_advance": 1,
    "failure_limit": 2,
    "watch_s": 4,
}

GATEWAY = {
    "port": 0,
    "routing": {"refresh_s": 1.0},
    "engine": {"max_num_seqs": 8},
    "brownout": {"enabled": False},
    "shadow": {"fraction": 1.0, "max_concurrent": 4},
}


@dataclass
class RolloutWorld:
    url: str
    key: str
    home: Home
    cfg: LifecycleConfig
    prompts: list[str]
    max_tokens: int = 8

    def controller(self) -> Any:
        from flows.rollout import open_controller

        return open_controller(self.cfg, self.home, actor="tests")

    def registry(self) -> Any:
        from flows.stages import open_registry

        return open_registry(self.cfg, self.home)

    def readyz(self) -> dict[str, Any]:
        return httpx.get(self.url + "/readyz", timeout=10).json()

    def traffic(self, n: int, concurrency: int = 4, offset: int = 0) -> Any:
        from flows.traffic import replay

        prompts = [self.prompts[(offset + i) % len(self.prompts)] for i in range(n)]
        return asyncio.run(
            replay(
                prompts,
                base_url=self.url + "/v1",
                api_key=self.key,
                rate=50,
                concurrency=concurrency,
                max_tokens=self.max_tokens,
                stream_share=0.5,
                conversation_share=1.0,  # every user a conversation of their own: the split hashes them apart
                follow_up_share=0.0,
            )
        )

    def wait_deployment(self, predicate: Any, timeout_s: float = 120) -> dict[str, Any]:
        """Until the gateway's view of the registry (refreshed every second) satisfies ``predicate``."""
        deadline = time.monotonic() + timeout_s
        while True:
            body = self.readyz()
            dep = body.get("deployment", {})
            if predicate(dep, body):
                return body
            if time.monotonic() > deadline:
                raise AssertionError(f"the gateway never reached the expected deployment: {json.dumps(body)[:2000]}")
            time.sleep(0.3)


@contextmanager
def rollout_world(
    cfg: LifecycleConfig,
    home: Home,
    policy: dict[str, Any],
    prompts: list[str],
    serving: dict[str, Any] | None = None,
    max_tokens: int = 8,
) -> Iterator[RolloutWorld]:
    """``cfg`` with the test gateway's settings (``GATEWAY`` + ``serving``) and ``policy`` as ``rollout``; a gateway
    on ``home`` and a key for the simulated users."""
    from flows.stages import serve_spec
    from serving.launcher import GatewayProcess
    from serving.runtime import database_url
    from serving.state.store import ServingStore

    merged = deep_merge(cfg.model_dump(mode="json"), {"serving": deep_merge(GATEWAY, serving or {}), "rollout": policy})
    cfg = LifecycleConfig.model_validate(merged)
    spec = serve_spec(cfg, home)
    with ServingStore(database_url(spec)) as store:
        _, key = store.create_key("users", requests_per_minute=100_000, tokens_per_minute=100_000_000)
    with GatewayProcess(spec) as proc:
        yield RolloutWorld(proc.url, key, home, cfg, prompts, max_tokens)


def run_rollout(world: RolloutWorld, version: str, *, on_canary: Any = None, max_ticks: int = 12) -> list[Any]:
    """Challenger -> ticks with traffic in between, until the rollout ends. Returns every decision."""
    from flows.rollout import promote

    promote(world.cfg, world.home, "chat", version, reason="rollout test", force=False)
    controller = world.controller()
    decisions: list[Any] = []
    for tick in range(max_ticks):
        made = controller.tick()
        decisions += made
        if any(d.action in ("rollback", "finish", "reject") for d in made):
            return decisions
        dep = world.registry().deployment("chat")
        if "shadow" in dep.aliases:
            world.wait_deployment(lambda d, b: d.get("shadow") == f"chat/{version}" and engines_ready(b))
        elif dep.canary_weight:
            weight = dep.canary_weight
            world.wait_deployment(lambda d, b, w=weight: d.get("canary_weight") == w and engines_ready(b))
            if on_canary is not None:
                on_canary()
                on_canary = None
        world.traffic(60, offset=60 * tick)
    raise AssertionError(f"the rollout did not end in {max_ticks} ticks: {[d.line() for d in decisions]}")


def engines_ready(body: dict[str, Any]) -> bool:
    return all(e["state"] == "ready" for e in body["engines"].values())


def ticks_after_canary_traffic(decisions: list[Any]) -> int:
    """Analyses after the one that moved the rollout from shadow to its first canary step."""
    first = next(i for i, d in enumerate(decisions) if d.action == "advance" and d.phase == "shadow")
    return len(decisions) - 1 - first


@dataclass
class Registered:
    """A home whose registry holds the tiny base model, and a LoRA adapter on it ready to register as versions."""

    home: Home
    reg: Any
    base_version: Any
    base: Path
    adapter: Path
    weights: str  # the adapter's weights hash; suffix it to register the same weights as another engine
    manifest: dict[str, Any]

    def add(self, suffix: str, *, gated: bool = True) -> Any:
        return register_version(self.reg, self.base_version, self.adapter, "lora", self.weights + suffix, gated)


def registered_base(cfg: LifecycleConfig, tiny_base_model: Any, factory: Any, name: str) -> Registered:
    from flows.stages import open_registry
    from registry.lineage import register_base_model
    from support.helpers import lora_adapter

    home = Home(factory.mktemp(name))
    base = Path(tiny_base_model.path)
    reg = open_registry(cfg, home)
    manifest = json.loads((base / "lifecycle.json").read_text())
    base_version = register_base_model(reg, folder=base, manifest=manifest, curve=[], git_sha="t", flow_run_id="t")
    adapter = lora_adapter(base, factory.mktemp("adapter"), seed=1)
    return Registered(home, reg, base_version, base, adapter, f"lora-1-{manifest['weights_hash']}", manifest)


def register_version(reg: Any, base_version: Any, folder: Path, method: str, weights: str, gated: bool) -> Any:
    """A version of chat registered from ``folder`` without training (gated: a passing gate record, no evals)."""
    run_id = reg.log_run(run_name="rollout-test", params={}, metrics=[], artifacts={"model": folder}, tags={})
    mv = reg.register(
        "chat",
        run_id,
        "model",
        {"lineage.base_model": base_version.ref, "lineage.weights_hash": weights, "lineage.method": method},
    )
    if gated:
        record_passing_gate(reg, mv.version, "test fixture: gated without evals")
    return mv


def record_passing_gate(reg: Any, version: str, summary: str, policy: str = "tests") -> None:
    """A passing gate record written without evals: the rollout is under test, not the gate."""
    from registry.gate import GateRecord, record_gate

    record = GateRecord(
        passed=True,
        summary=summary,
        failing=[],
        policy=policy,
        policy_hash="0" * 64,
        champion=None,
        eval_sets="-",
        verdicts={},
        metrics={},
    )
    record_gate(reg, "chat", version, record, actor="tests")
