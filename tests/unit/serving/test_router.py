"""The router on a fake registry and a fake engine factory: which versions share an engine, what each model name
routes to, what is loaded on demand and what is refused, how alias moves and engine restarts are picked up, and how
the rollout aliases (challenger, shadow) are loaded, weighted and retired."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from unit.serving.fakes import FakeEngine, FakeFactory, FakeRegistry
from unit.serving.harness import registry_with_versions

from core.errors import NotFoundError
from registry.store import Deployment
from serving.config import RoutingConfig
from serving.engines.engine import GenerationRequest
from serving.engines.router import Router, ServedModel

BASE_ENGINE = "lora:w-chat-base-1"
FALLBACK_ENGINE = "lora:w-chat-base-1#chat/1"


@pytest.fixture
def registry(tmp_path: Path) -> FakeRegistry:
    return registry_with_versions(tmp_path)


@pytest.fixture
def factory() -> FakeFactory:
    return FakeFactory()


def router(registry: FakeRegistry, factory: FakeFactory, **routing: object) -> Router:
    r = Router(registry, RoutingConfig.model_validate(routing), "chat", factory)
    r.load_configured()
    return r


def test_lora_versions_share_one_base_engine_with_distinct_adapters(
    registry: FakeRegistry, factory: FakeFactory
) -> None:
    r = router(registry, factory, extra=["chat@canary"])
    assert factory.starts == [(BASE_ENGINE, registry.folder("chat-base/1"), True)]  # the base's folder, LoRA on
    champion, canary = r.route("chat").model, r.route("chat@canary").model
    assert champion.engine is canary.engine
    assert champion.adapter is not None and canary.adapter is not None
    assert (champion.adapter.name, champion.adapter.path) == ("chat/2", registry.folder("chat/2"))
    assert (canary.adapter.name, canary.adapter.path) == ("chat/4", registry.folder("chat/4"))
    assert champion.adapter.id != canary.adapter.id
    assert champion.adapter.id > 0 and canary.adapter.id > 0


def test_full_versions_get_their_own_engine(registry: FakeRegistry, factory: FakeFactory) -> None:
    r = router(registry, factory, extra=["chat/3"])
    assert factory.starts == [
        (BASE_ENGINE, registry.folder("chat-base/1"), True),
        ("full:w-chat-3", registry.folder("chat/3"), False),
    ]
    full = r.route("chat/3").model
    assert full.adapter is None
    assert full.engine is factory.engines["full:w-chat-3"]
    assert full.engine is not r.route("chat").model.engine


def test_full_versions_with_the_same_weights_share_an_engine(registry: FakeRegistry, factory: FakeFactory) -> None:
    registry.add_full("chat", "5", weights_hash="w-chat-3")  # re-registered, same weights hash
    r = router(registry, factory, extra=["chat/3", "chat/5"])
    assert [key for key, _, _ in factory.starts] == [BASE_ENGINE, "full:w-chat-3"]
    assert r.route("chat/3").model.engine is r.route("chat/5").model.engine


def test_fallback_gets_a_dedicated_engine_even_on_the_primarys_base(
    registry: FakeRegistry, factory: FakeFactory
) -> None:
    r = router(registry, factory, fallback="chat@previous-champion")
    # the two engines start side by side (two threads): in either order
    assert sorted(factory.starts) == [
        (BASE_ENGINE, registry.folder("chat-base/1"), True),
        (FALLBACK_ENGINE, registry.folder("chat-base/1"), True),
    ]
    route = r.route("chat")
    assert route.fallback is not None and r.fallback is not None
    assert route.fallback.engine is factory.engines[FALLBACK_ENGINE]
    assert route.fallback.engine is not route.model.engine
    assert route.fallback.header() == "chat/1; alias=previous-champion"
    assert route.fallback.adapter is not None and route.fallback.adapter.name == "chat/1"
    # the fallback version asked for by alias or pinned runs on its dedicated engine too
    assert r.route("chat@previous-champion").model.engine is route.fallback.engine
    assert r.route("chat/1").model.engine is route.fallback.engine


def test_served_name_follows_the_primary_alias(registry: FakeRegistry, factory: FakeFactory) -> None:
    r = router(registry, factory, fallback="chat@previous-champion")
    route = r.route("chat")
    assert route.model.ref == "chat/2"
    assert route.model.header() == "chat/2; alias=champion"
    assert route.follows_alias is True
    assert route.fallback is not None and route.fallback.ref == "chat/1"


def test_served_name_and_primary_alias_are_configurable(registry: FakeRegistry, factory: FakeFactory) -> None:
    r = router(registry, factory, served_name="assistant", primary_alias="canary")
    assert r.route("assistant").model.header() == "chat/4; alias=canary"
    with pytest.raises(NotFoundError):
        r.route("chat")  # "chat" is now only the registered model's name, not a model a client may send


def test_alias_route_follows_alias_with_the_fallback(registry: FakeRegistry, factory: FakeFactory) -> None:
    r = router(registry, factory, fallback="chat@previous-champion")
    route = r.route("chat@champion")
    assert route.model.header() == "chat/2; alias=champion"
    assert route.follows_alias is True
    assert route.fallback is not None and route.fallback.ref == "chat/1"


@pytest.mark.parametrize(("model", "header"), [("chat/2", "chat/2; alias=champion"), ("chat/1", "chat/1")])
def test_pinned_version_does_not_fail_over(
    registry: FakeRegistry, factory: FakeFactory, model: str, header: str
) -> None:
    r = router(registry, factory, fallback="chat@previous-champion" if model == "chat/2" else "chat/1")
    route = r.route(model)
    assert route.model.header() == header
    assert route.follows_alias is False
    assert route.fallback is None


@pytest.mark.parametrize(
    "model", ["chat@nope", "chat/99", "other", "other/1", "other@champion", "gpt-4o", "chat@@x", ""]
)
def test_unknown_names_are_not_found_with_a_helpful_message(
    registry: FakeRegistry, factory: FakeFactory, model: str
) -> None:
    r = router(registry, factory)
    with pytest.raises(NotFoundError) as caught:
        r.route(model)
    message = str(caught.value)
    assert f"The model {model!r} does not exist" in message
    assert "'chat', chat@ALIAS or chat/VERSION (GET /v1/models lists them)" in message
    assert len(factory.starts) == 1  # nothing was started trying


@pytest.mark.parametrize("model", ["chat@canary", "chat/4"])
def test_adapter_on_a_running_base_loads_on_demand(registry: FakeRegistry, factory: FakeFactory, model: str) -> None:
    r = router(registry, factory)
    served = r.route(model).model
    assert served.ref == "chat/4"
    assert served.engine is r.route("chat").model.engine
    assert served.adapter is not None and served.adapter.name == "chat/4"
    assert len(factory.starts) == 1
    assert "chat/4" in {s.ref for s in r.models()}


@pytest.mark.parametrize("model", ["chat/3", "chat@challenger"])
def test_version_needing_a_new_engine_is_refused_on_demand(
    registry: FakeRegistry, factory: FakeFactory, model: str
) -> None:
    registry.set_alias("chat", "challenger", "3")
    r = router(registry, factory)
    with pytest.raises(NotFoundError, match=r"chat/3 is registered but not loaded .* serving\.routing\.extra"):
        r.route(model)
    assert len(factory.starts) == 1


def test_adapter_of_a_base_without_an_engine_is_refused_on_demand(registry: FakeRegistry, factory: FakeFactory) -> None:
    registry.add_full("chat-base", "2")
    registry.add_lora("chat", "6", base="chat-base/2")
    r = router(registry, factory)
    with pytest.raises(NotFoundError, match="chat/6 is registered but not loaded"):
        r.route("chat/6")
    assert len(factory.starts) == 1


def test_adapter_without_base_model_lineage_cannot_load(registry: FakeRegistry, factory: FakeFactory) -> None:
    registry.add_lora("chat", "7", base=None)
    r = router(registry, factory)
    with pytest.raises(NotFoundError, match="chat/7 is a LoRA adapter without a lineage.base_model tag"):
        r.load("chat/7")


def test_new_alias_on_an_already_loaded_full_version_routes_to_it(registry: FakeRegistry, factory: FakeFactory) -> None:
    r = router(registry, factory, extra=["chat/3"])
    registry.set_alias("chat", "challenger", "3")
    served = r.route("chat@challenger").model
    assert served.header() == "chat/3; alias=challenger"
    assert len(factory.starts) == 2


def test_refresh_picks_up_a_moved_alias(registry: FakeRegistry, factory: FakeFactory) -> None:
    r = router(registry, factory)
    assert r.route("chat").model.ref == "chat/2"
    registry.set_alias("chat", "champion", "4")
    assert r.refresh() == ["champion: 2 -> 4"]
    route = r.route("chat")
    assert route.model.header() == "chat/4; alias=champion"
    assert route.model.engine is factory.engines[BASE_ENGINE]  # an adapter: no new engine
    assert len(factory.starts) == 1
    assert r.refresh() == []  # nothing moved since
    assert r.route("chat/2").model.header() == "chat/2"  # the old version stays loaded, now without the alias


def test_refresh_starts_an_engine_for_a_full_version_an_alias_moved_to(
    registry: FakeRegistry, factory: FakeFactory
) -> None:
    r = router(registry, factory)
    registry.set_alias("chat", "champion", "3")
    assert r.refresh() == ["champion: 2 -> 3"]
    assert r.route("chat").model.engine is factory.engines["full:w-chat-3"]


def test_refresh_drops_a_removed_alias_but_keeps_the_primary(registry: FakeRegistry, factory: FakeFactory) -> None:
    r = router(registry, factory)
    r.route("chat@canary")
    registry.remove_alias("chat", "canary")
    registry.remove_alias("chat", "champion")
    assert r.refresh() == ["canary: removed"]
    assert "canary" not in r.aliases
    with pytest.raises(NotFoundError, match="does not exist"):
        r.route("chat@canary")
    assert r.route("chat").model.ref == "chat/2"  # keeps answering until an alias names another version


def test_refresh_moves_the_fallback_with_its_alias(registry: FakeRegistry, factory: FakeFactory) -> None:
    r = router(registry, factory, fallback="chat@previous-champion")
    registry.set_alias("chat", "champion", "4")
    registry.set_alias("chat", "previous-champion", "2")  # a promotion: 2 steps down, 4 takes over
    r.refresh()
    route = r.route("chat")
    assert route.model.ref == "chat/4"
    assert route.fallback is not None and route.fallback.ref == r.route("chat@previous-champion").model.ref == "chat/2"
    assert route.fallback.engine is not route.model.engine


def test_replace_engine_moves_every_version_on_it(registry: FakeRegistry, factory: FakeFactory) -> None:
    r = router(registry, factory, fallback="chat@previous-champion")
    r.route("chat@canary")
    old_fallback_engine = factory.engines[FALLBACK_ENGINE]
    restarted = FakeEngine(BASE_ENGINE)
    r.replace_engine(BASE_ENGINE, restarted)
    assert r.engines()[BASE_ENGINE] is restarted
    for model in ("chat", "chat@champion", "chat/2", "chat@canary", "chat/4"):
        assert r.route(model).model.engine is restarted, model
    assert r.route("chat").model.adapter is not None and r.route("chat").model.adapter.name == "chat/2"
    assert r.route("chat").model.header() == "chat/2; alias=champion"
    assert r.fallback is not None and r.fallback.engine is old_fallback_engine  # another engine: untouched

    new_fallback = FakeEngine(FALLBACK_ENGINE)
    r.replace_engine(FALLBACK_ENGINE, new_fallback)
    assert r.fallback.engine is new_fallback
    route = r.route("chat")
    assert route.fallback is not None and route.fallback.engine is new_fallback
    assert r.route("chat/1").model.engine is new_fallback
    assert route.model.engine is restarted


def test_models_lists_loaded_versions_with_their_aliases(registry: FakeRegistry, factory: FakeFactory) -> None:
    r = router(registry, factory, fallback="chat@previous-champion")
    assert sorted(s.header() for s in r.models()) == ["chat/1; alias=previous-champion", "chat/2; alias=champion"]
    r.route("chat/4")
    assert sorted(s.header() for s in r.models()) == [
        "chat/1; alias=previous-champion",
        "chat/2; alias=champion",
        "chat/4",  # loaded pinned: the router has not seen its alias yet
    ]
    assert r.aliases == {"champion": "2", "previous-champion": "1"}


def test_shutdown_stops_every_engine(registry: FakeRegistry, factory: FakeFactory) -> None:
    r = router(registry, factory, fallback="chat@previous-champion", extra=["chat/3"])
    r.shutdown()
    assert {k: e.state for k, e in factory.engines.items()} == {
        BASE_ENGINE: "stopped",
        FALLBACK_ENGINE: "stopped",
        "full:w-chat-3": "stopped",
    }


def test_failed_engine_start_on_refresh_keeps_the_old_version(registry: FakeRegistry, factory: FakeFactory) -> None:
    factory.fail_keys.add("full:w-chat-3")
    r = router(registry, factory)
    registry.set_alias("chat", "champion", "3")
    assert r.refresh() == []  # not raised: one alias failing must not stop the others from following
    assert r.load_errors == {"champion": "chat/3: RuntimeError: engine full:w-chat-3 failed to start"}
    assert r.route("chat").model.header() == "chat/2; alias=champion"  # still answering with what it had
    factory.fail_keys.clear()
    assert r.refresh() == ["champion: 2 -> 3"]  # and the move is retried
    assert r.load_errors == {}


# ------------------------------------------------------------------------------------------------- rollout aliases

FULL_ENGINE = "full:w-chat-3"


def hold(engine: FakeEngine, served: ServedModel) -> AsyncIterator[object]:
    """An engine request of ``served`` that stays in flight until closed (the test advances it once)."""
    return engine.generate(GenerationRequest(f"held-{served.ref}", [1], 10, adapter=served.adapter))


def test_challenger_adapter_loads_on_the_running_base_engine_with_its_weight(
    registry: FakeRegistry, factory: FakeFactory
) -> None:
    r = router(registry, factory)
    assert r.route("chat").canary is None and r.route("chat").canary_weight == 0
    registry.set_alias("chat", "challenger", "4")
    registry.set_weight("chat", 25)
    assert r.refresh() == ["challenger: none -> 4", "canary weight: 0% -> 25%"]
    route = r.route("chat")
    assert route.canary is not None and route.canary.header() == "chat/4; alias=challenger"
    assert route.canary.engine is route.model.engine  # an adapter: no new engine
    assert route.canary.adapter is not None and route.canary.adapter.name == "chat/4"
    assert (route.canary_weight, route.shadow) == (25, None)
    assert len(factory.starts) == 1
    assert r.route("chat@champion").canary is None  # the split is the served name's only
    assert r.deployment_state()["challenger"] == "chat/4"
    registry.set_weight("chat", 50)
    assert r.refresh() == ["canary weight: 25% -> 50%"]
    assert r.route("chat").canary_weight == 50


def test_shadow_alias_is_loaded_for_the_served_name(registry: FakeRegistry, factory: FakeFactory) -> None:
    r = router(registry, factory)
    registry.set_alias("chat", "shadow", "4")
    assert r.refresh() == ["shadow: none -> 4"]
    route = r.route("chat")
    assert route.shadow is not None and route.shadow.header() == "chat/4; alias=shadow"
    assert route.canary is None
    assert r.deployment_state() == {
        "champion": "chat/2",
        "challenger": None,
        "canary_weight": 0,
        "shadow": "chat/4",
        "fallback": None,
        "load_errors": {},
        "retiring_engines": [],
    }


@pytest.mark.anyio
async def test_removed_challenger_is_retired_and_its_adapter_unloaded_once_unused(
    registry: FakeRegistry, factory: FakeFactory
) -> None:
    r = router(registry, factory)
    registry.set_alias("chat", "challenger", "4")
    registry.set_weight("chat", 10)
    r.refresh()
    canary = r.route("chat").canary
    assert canary is not None and canary.adapter is not None
    base = factory.engines[BASE_ENGINE]
    held = hold(base, canary)
    await held.__anext__()  # a canary request still running when the rollout is rolled back

    registry.remove_alias("chat", "challenger")
    registry.set_weight("chat", 0)
    assert r.refresh() == ["challenger: removed", "canary weight: 10% -> 0%", "retired chat/4"]
    assert r.route("chat").canary is None  # out of routing at once
    assert "chat/4" not in {s.ref for s in r.models()}
    assert await r.unload_adapters() == []  # due only from the next refresh on
    r.refresh()
    assert await r.unload_adapters() == []  # still used by the running request
    assert base.removed == []
    await held.aclose()  # type: ignore[attr-defined]
    assert await r.unload_adapters() == [f"adapter chat/4 unloaded from engine {BASE_ENGINE}"]
    assert base.removed == [canary.adapter]
    assert base.state == "ready" and r.route("chat").model.engine is base  # the champion's engine stays
    assert await r.unload_adapters() == []


@pytest.mark.anyio
async def test_full_version_challenger_gets_its_own_engine_shut_down_after_retirement_when_idle(
    registry: FakeRegistry, factory: FakeFactory
) -> None:
    r = router(registry, factory)
    registry.set_alias("chat", "challenger", "3")
    registry.set_weight("chat", 5)
    r.refresh()
    assert [k for k, _, _ in factory.starts] == [BASE_ENGINE, FULL_ENGINE]
    canary = r.route("chat").canary
    full = factory.engines[FULL_ENGINE]
    assert canary is not None and canary.engine is full and canary.adapter is None
    held = hold(full, canary)
    await held.__anext__()

    registry.remove_alias("chat", "challenger")
    changes = r.refresh()
    assert changes[-2:] == ["retired chat/3", f"engine {FULL_ENGINE} retired (shut down once idle)"]
    assert FULL_ENGINE not in r.engines() and r.route("chat").canary is None
    assert r.deployment_state()["retiring_engines"] == [FULL_ENGINE]
    assert r.refresh() == []  # a request is still in flight on it
    assert full.shutdowns == 0
    await held.aclose()  # type: ignore[attr-defined]
    assert r.refresh() == [f"engine {FULL_ENGINE} shut down"]
    assert (full.shutdowns, full.state) == (1, "stopped")
    assert r.deployment_state()["retiring_engines"] == []
    assert factory.engines[BASE_ENGINE].state == "ready"


def test_retired_engine_not_yet_shut_down_serves_again(registry: FakeRegistry, factory: FakeFactory) -> None:
    r = router(registry, factory)
    registry.set_alias("chat", "challenger", "3")
    r.refresh()
    registry.remove_alias("chat", "challenger")
    r.refresh()
    registry.set_alias("chat", "challenger", "3")  # rolled forward again before the next refresh reaped it
    assert r.refresh() == ["challenger: none -> 3"]
    assert [k for k, _, _ in factory.starts] == [BASE_ENGINE, FULL_ENGINE]  # no second start
    canary = r.route("chat").canary
    assert canary is not None and canary.engine is factory.engines[FULL_ENGINE]
    assert canary.engine.state == "ready"


def test_challenger_moved_to_another_version_retires_the_old_one(registry: FakeRegistry, factory: FakeFactory) -> None:
    registry.add_lora("chat", "5", base="chat-base/1")
    r = router(registry, factory)
    registry.set_alias("chat", "challenger", "4")
    r.refresh()
    registry.set_alias("chat", "challenger", "5")
    assert r.refresh() == ["challenger: 4 -> 5", "retired chat/4"]
    canary = r.route("chat").canary
    assert canary is not None and canary.ref == "chat/5"


def test_promoted_challenger_is_not_retired(registry: FakeRegistry, factory: FakeFactory) -> None:
    r = router(registry, factory, fallback="chat@previous-champion")
    registry.set_alias("chat", "challenger", "4")
    registry.set_weight("chat", 50)
    r.refresh()
    registry.set_alias("chat", "champion", "4")  # the controller promotes: champion 4, previous-champion 2
    registry.set_alias("chat", "previous-champion", "2")
    registry.remove_alias("chat", "challenger")
    registry.set_weight("chat", 0)
    changes = r.refresh()
    assert changes[:3] == ["champion: 2 -> 4", "previous-champion: 1 -> 2", "retired chat/1 (old fallback)"]
    assert "retired chat/4" not in changes
    route = r.route("chat")
    assert route.model.header() == "chat/4; alias=champion" and route.canary is None
    assert route.fallback is not None and route.fallback.ref == "chat/2"
    old_fallback = factory.engines[FALLBACK_ENGINE]
    assert FALLBACK_ENGINE not in r.engines()
    r.refresh()
    assert old_fallback.state == "stopped"  # the old fallback's dedicated engine does not linger


def test_challenger_that_fails_to_start_leaves_the_champion_serving(
    registry: FakeRegistry, factory: FakeFactory
) -> None:
    factory.fail_keys.add(FULL_ENGINE)
    r = router(registry, factory)
    registry.set_alias("chat", "challenger", "3")
    registry.set_weight("chat", 25)
    assert r.refresh() == ["canary weight: 0% -> 25%"]
    route = r.route("chat")
    assert route.canary is None and route.canary_weight == 0
    assert route.model.header() == "chat/2; alias=champion"
    state = r.deployment_state()
    assert state["challenger"] is None and state["canary_weight"] == 0
    assert state["load_errors"] == {"challenger": f"chat/3: RuntimeError: engine {FULL_ENGINE} failed to start"}
    factory.fail_keys.clear()
    assert r.refresh() == ["challenger: none -> 3"]
    assert r.deployment_state()["load_errors"] == {}
    assert r.route("chat").canary_weight == 25


def test_refresh_reads_the_deployment_once(registry: FakeRegistry, factory: FakeFactory) -> None:
    r = router(registry, factory)
    calls: list[str] = []
    real = registry.deployment

    def counted(name: str) -> Deployment:
        calls.append(name)
        return real(name)

    registry.deployment = counted  # type: ignore[method-assign]
    registry.set_alias("chat", "challenger", "4")
    registry.set_alias("chat", "shadow", "3")
    r.refresh()
    assert calls == ["chat"]


def test_shutdown_during_an_engine_start_stops_that_engine(registry: FakeRegistry, factory: FakeFactory) -> None:
    r = router(registry, factory)
    r.shutdown()
    registry.set_alias("chat", "challenger", "3")
    r.refresh()
    assert factory.engines[FULL_ENGINE].state == "stopped"
    assert "challenger" in r.load_errors
