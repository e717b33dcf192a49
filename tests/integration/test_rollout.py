"""Progressive delivery through the real gateway: ``bentoml serve`` + vLLM, the MLflow registry, the controller.

The controller is ticked by the test between rounds of simulated users (``tests/support/rollout_helpers.py``).
Versions are registered without training (``helpers.lora_adapter``): chat/1 the champion, chat/2 a good
challenger (the same adapter weights), chat/3 the same weights made slow by fault injection (300 ms before the
first token), chat/4 a full model on an engine of its own (the one whose engine is killed), chat/5 never gated.

"Each rollback reaches weight 0 within two analysis intervals": counted in ticks after the canary first got
traffic, and the gateway's /readyz must show the challenger gone afterwards.
"""

from __future__ import annotations

import os
import signal
import statistics
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import pytest
from support import rollout_helpers
from support.rollout_helpers import (
    RolloutWorld,
    register_version,
    registered_base,
    rollout_world,
    run_rollout,
    ticks_after_canary_traffic,
)

from flows.config import LifecycleConfig

POLICY = {
    **rollout_helpers.POLICY,
    # the slow version must reach its canary step (the shadow comparison alone would already stop it)
    # (and chat/4, the base model next to a LoRA champion, answers differently on purpose: its drill is the canary)
    "thresholds": {"shadow_ttft_delta_ms": 60_000, "shadow_min_similarity": -1.0},
}


@pytest.fixture(scope="module")
def world(
    tiny_config: LifecycleConfig, tiny_base_model: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RolloutWorld]:
    from flows.traffic import traffic_prompts

    r = registered_base(tiny_config, tiny_base_model, tmp_path_factory, "rollout-home")
    home, reg = r.home, r.reg
    champion = r.add("")
    reg.set_alias("chat", "champion", champion.version, reason="rollout test fixture", actor="tests")
    reg.set_model_tags("chat", {"rollout.champion": champion.version})
    r.add("-good")  # chat/2
    r.add("-slow")  # chat/3
    register_version(reg, r.base_version, r.base, "full", r.manifest["weights_hash"], gated=True)  # chat/4
    r.add("-ungated", gated=False)  # chat/5
    prompts = traffic_prompts(tiny_config.data.generator, "normal", 200)
    serving = {"faults": [{"version": "chat/3", "ttft_delay_ms": 300}]}
    with rollout_world(tiny_config, home, POLICY, prompts, serving) as world:
        yield world


def test_ungated_challenger_from_the_registry_ui_is_reverted(world: RolloutWorld, capsys: Any) -> None:
    from flows.cli import main

    # the CLI refuses it in one line ...
    code = main(["promote", "chat", "5", "--home", str(world.home.root), "--config", "configs/tiny.yaml"])
    err = capsys.readouterr().err.strip()
    assert code == 1 and "chat/5 has no passing gate record" in err and "\n" not in err
    # ... and the controller reverts it when a reviewer sets the alias in the MLflow UI
    reg = world.registry()
    reg.set_alias("chat", "challenger", "5", reason="set in the MLflow UI", actor="reviewer")
    [d] = world.controller().tick()
    assert d.action == "reject"
    mv = reg.get("chat", "5")
    assert "challenger" not in mv.aliases and "no passing gate record" in mv.tags["rollout.rejected"]
    assert any(e["alias"] == "challenger" and e["to"] is None for e in reg.audit_log())
    # the same for champion set directly on the ungated version
    reg.set_alias("chat", "champion", "5", reason="set in the MLflow UI", actor="reviewer")
    [d] = world.controller().tick()
    assert d.action == "revert" and reg.deployment("chat").aliases["champion"] == "1"


def test_slow_canary_is_rolled_back_within_two_intervals(world: RolloutWorld) -> None:
    decisions = run_rollout(world, "3")
    last = decisions[-1]
    assert last.action == "rollback", [d.line() for d in decisions]
    assert any(name.startswith("ttft") for name in last.reason.replace(",", " ").split()) or "ttft" in last.reason
    assert ticks_after_canary_traffic(decisions) <= 2
    world.wait_deployment(lambda d, b: d.get("challenger") is None and d.get("canary_weight") == 0, 30)
    tags = world.registry().get("chat", "3").tags
    assert tags["rollout.quarantined"] == "true" and "ttft" in tags["rollout.failing"]


@pytest.mark.slow  # starts an engine of its own (~1 min)
def test_canary_whose_engine_dies_is_rolled_back_while_the_champion_serves(world: RolloutWorld) -> None:
    served: list[Any] = []

    def kill_canary_engine() -> None:
        engines = world.readyz()["engines"]
        [pids] = [e["pids"] for key, e in engines.items() if key.startswith("full:")]
        for pid in pids:
            os.kill(pid, signal.SIGKILL)

    decisions = run_rollout(world, "4", on_canary=kill_canary_engine)
    assert decisions[-1].action == "rollback", [d.line() for d in decisions]
    assert "success_rate" in decisions[-1].reason
    assert ticks_after_canary_traffic(decisions) <= 2
    world.wait_deployment(lambda d, b: d.get("challenger") is None, 30)
    report = world.traffic(20)
    served.append(report)
    assert report.ok == report.sent and not report.errors  # the champion answers everyone
    assert set(report.by_version) == {"chat/1"}


def test_good_canary_goes_through_shadow_and_canary_to_champion(world: RolloutWorld) -> None:
    from flows.stages import serve_spec
    from serving.runtime import database_url
    from serving.state.store import ServingStore

    decisions = run_rollout(world, "2")
    actions = [d.action for d in decisions]
    assert actions[0] == "start" and "promote" in actions and actions[-1] == "finish", actions
    dep = world.registry().deployment("chat")
    assert dep.aliases["champion"] == "2" and dep.aliases["previous-champion"] == "1"
    assert "challenger" not in dep.aliases and dep.canary_weight == 0
    with ServingStore(database_url(serve_spec(world.cfg, world.home))) as store:
        pairs = store.shadow_log(shadow_version="chat/2")
        rows = store.request_log()
    assert len(pairs) >= POLICY["shadow_min_samples"]
    # the same weights with the primary's seed: near-identical answers (bf16 numerics differ with the batch, so
    # a sampled token can flip now and then)
    similarities = [p.similarity for p in pairs if p.status == "ok" and p.similarity is not None]
    assert similarities and statistics.median(similarities) > 0.9, similarities
    assert any(r.model_version == "chat/2" and r.alias == "challenger" for r in rows)
    # the shadow's answers never reached a user: no log row of chat/2 from the shadow phase
    shadow_ended = datetime.fromisoformat(next(d for d in decisions if d.action == "advance").at)
    assert not [r for r in rows if r.model_version == "chat/2" and r.at < shadow_ended]
    world.wait_deployment(lambda d, b: d.get("champion") == "chat/2", 30)
    report = world.traffic(10)
    assert set(report.by_version) == {"chat/2"}
