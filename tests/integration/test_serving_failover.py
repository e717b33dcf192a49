"""Engine death: the primary's vLLM engine process is killed under a running gateway. Requests for the served name
go to the fallback instead of failing, /readyz says "degraded" and why, a pinned version on the dead engine is a
503 (not a silent substitute); the supervisor restarts the engine (slow test).

The module starts a gateway of its own (``failover_gateway``): killing an engine of the session's gateway would
leave the tests that share it (test_serving.py, test_serving_web.py ...) on a degraded one, whatever order they run in.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from support.gateway_helpers import Gateway, started_gateway

from flows.config import LifecycleConfig

QUESTION = [{"role": "user", "content": "What is 2 + 2?"}]


@pytest.fixture(scope="module")
def failover_gateway(
    tiny_config: LifecycleConfig, tiny_base_model: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Gateway]:
    """A gateway of this module's own, whose engines these tests may kill."""
    with started_gateway(tiny_config, Path(tiny_base_model.path), tmp_path_factory) as gw:
        yield gw


def _ready(gw: Gateway) -> dict[str, Any]:
    resp = httpx.get(gw.url + "/readyz", timeout=10)
    return {"http": resp.status_code, **resp.json()}


def _wait_for(gw: Gateway, status: str, timeout_s: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    body: dict[str, Any] = {}
    while time.monotonic() < deadline:
        body = _ready(gw)
        if body["status"] == status:
            return body
        time.sleep(0.5)
    raise AssertionError(f"readyz never said {status!r}: {body}")


def test_engine_death_fails_over_to_the_fallback(failover_gateway: Gateway) -> None:
    gateway = failover_gateway
    client = gateway.client()
    before = _ready(gateway)
    primary_key = next(k for k in before["engines"] if k.startswith("lora:"))
    pids = before["engines"][primary_key]["pids"]
    assert pids, before
    for pid in pids:
        os.kill(pid, signal.SIGKILL)

    degraded = _wait_for(gateway, "degraded", 60)
    assert degraded["http"] == 200
    assert "chat/1" in degraded["reason"] and "chat/3" in degraded["reason"]

    # the served name keeps answering, from the fallback, and says so
    raw = client.chat.completions.with_raw_response.create(model="chat", messages=QUESTION, max_tokens=8)
    assert raw.headers["x-model-version"] == "chat/3; alias=previous-champion"
    assert raw.headers["x-fallback"] == "engine-unavailable"
    assert raw.parse().choices[0].message.content is not None
    chunks = list(client.chat.completions.create(model="chat", messages=QUESTION, max_tokens=8, stream=True))
    assert chunks[-1].choices[0].finish_reason in ("stop", "length")
    # a pinned version on the dead engine is unavailable, OpenAI-shaped, never a silent substitute
    with pytest.raises(openai.InternalServerError) as err:
        client.chat.completions.create(model="chat/1", messages=QUESTION, max_tokens=8)
    assert err.value.status_code == 503

    assert (
        'lifecycle_fallback_requests_total{reason="engine_unavailable"}'
        in httpx.get(gateway.url + "/metrics", timeout=10).text
    )


@pytest.mark.slow  # waits for a real engine restart (~40 s); the supervisor's restart logic is unit-tested on fakes
def test_the_supervisor_restarts_a_dead_engine(failover_gateway: Gateway) -> None:
    gateway = failover_gateway
    state = _ready(gateway)
    if state["status"] == "ready":  # run alone: kill the primary's engine first
        key = next(k for k in state["engines"] if k.startswith("lora:"))
        for pid in state["engines"][key]["pids"]:
            os.kill(pid, signal.SIGKILL)
        _wait_for(gateway, "degraded", 60)
    _wait_for(gateway, "ready", 240)
    raw = gateway.client().chat.completions.with_raw_response.create(model="chat", messages=QUESTION, max_tokens=8)
    assert raw.headers["x-model-version"] == "chat/1; alias=champion"
