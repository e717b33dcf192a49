"""The runtime's supervisor on fakes: a dead engine is restarted from the same folder and swapped in (requests go to
the fallback meanwhile), an alias moved in the registry is picked up without a restart, and a rollout is followed
(challenger loaded with its weight, then retired and its adapter unloaded)."""

from __future__ import annotations

import anyio
import pytest
from unit.serving.harness import PRIMARY_KEY, MakeHarness

from serving import runtime as runtime_module

pytestmark = pytest.mark.anyio


@pytest.fixture(autouse=True)
def fast_supervisor(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runtime_module, "SUPERVISE_S", 0.01)


async def test_supervisor_restarts_a_dead_engine(make_harness: MakeHarness) -> None:
    h = make_harness()
    dead = h.primary
    dead.state = "dead"
    r = await h.chat()
    assert r.headers["x-fallback"] == "engine-unavailable"
    assert (await h.request("GET", "/readyz")).json()["status"] == "degraded"

    async with anyio.create_task_group() as tg:
        tg.start_soon(h.runtime.supervise)
        with anyio.fail_after(1):
            while h.factory.engines[PRIMARY_KEY] is dead or h.runtime.gateway.router.engines()[PRIMARY_KEY] is dead:
                await anyio.sleep(0.01)
        tg.cancel_scope.cancel()

    restarted = h.factory.engines[PRIMARY_KEY]
    assert h.factory.starts[-1] == (PRIMARY_KEY, dead.folder, True)  # same folder, LoRA on
    assert dead.shutdowns == 1
    assert (await h.request("GET", "/readyz")).json()["status"] == "ready"
    r = await h.chat()
    assert "x-fallback" not in r.headers
    assert r.headers["x-model-version"] == "chat/2; alias=champion"
    assert len(restarted.requests) == 1


async def test_supervisor_picks_up_a_moved_alias(make_harness: MakeHarness) -> None:
    h = make_harness()
    h.registry.set_alias("chat", "champion", "4")
    async with anyio.create_task_group() as tg:
        tg.start_soon(h.runtime.supervise)
        with anyio.fail_after(1):
            while h.runtime.gateway.router.aliases["champion"] != "4":
                await anyio.sleep(0.01)
        tg.cancel_scope.cancel()
    r = await h.chat()
    assert r.headers["x-model-version"] == "chat/4; alias=champion"
    assert h.primary.requests[0].adapter is not None and h.primary.requests[0].adapter.name == "chat/4"


async def test_supervisor_follows_a_rollout_and_unloads_the_retired_adapter(make_harness: MakeHarness) -> None:
    h = make_harness(serving={"routing": {"refresh_s": 0.01}})
    router = h.runtime.gateway.router
    h.registry.set_alias("chat", "challenger", "4")
    h.registry.set_weight("chat", 30)
    async with anyio.create_task_group() as tg:
        tg.start_soon(h.runtime.supervise)
        with anyio.fail_after(2):
            while router.route("chat").canary_weight != 30:
                await anyio.sleep(0.01)
        body = (await h.request("GET", "/readyz")).json()
        assert (body["deployment"]["challenger"], body["deployment"]["canary_weight"]) == ("chat/4", 30)
        h.registry.remove_alias("chat", "challenger")  # rolled back
        h.registry.set_weight("chat", 0)
        with anyio.fail_after(2):
            while not h.primary.removed:
                await anyio.sleep(0.01)
        tg.cancel_scope.cancel()
    assert [a.name for a in h.primary.removed] == ["chat/4"]
    assert router.route("chat").canary is None
    assert h.primary.state == "ready"  # the champion's engine serves on
