"""The HTTP surface of ``create_app`` on fake engines: SSE framing and the non-streaming body, the headers every answer
carries, every error status with an OpenAI-shaped body, and the other routes (models, conversations, usage, health,
readiness, metrics, the page)."""

from __future__ import annotations

import re
from typing import Any

import httpx
import pytest
from unit.serving.fakes import FakeFactory, FakeTokenizer
from unit.serving.harness import FALLBACK_KEY, PRIMARY_KEY, MakeHarness, sse_events

from serving.engines.engine import engine_label

pytestmark = pytest.mark.anyio

PIECES = ["Hello", " there", ", friend", "!"]
USER = [{"role": "user", "content": "hello there"}]


def assert_openai_error(r: httpx.Response, status: int, code: str | None, param: str | None = None) -> dict[str, Any]:
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == "application/json"
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert (error["code"], error["param"]) == (code, param)
    assert error["message"]
    assert re.fullmatch(r"chatcmpl-[0-9a-f]{24}", r.headers["x-request-id"])
    return error


# ------------------------------------------------------------------------------------------------- SSE and bodies


@pytest.mark.parametrize("include_usage", [None, False, True])
async def test_sse_framing(make_harness: MakeHarness, include_usage: bool | None) -> None:
    h = make_harness(factory=FakeFactory(pieces=PIECES))
    extra = {} if include_usage is None else {"stream_options": {"include_usage": include_usage}}
    r = await h.chat(model="chat@champion", stream=True, **extra)
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/event-stream")
    assert r.headers["cache-control"] == "no-cache"
    events = sse_events(r)
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    rid = r.headers["x-request-id"]
    for c in chunks:
        assert (c["id"], c["object"], c["model"]) == (rid, "chat.completion.chunk", "chat@champion")
        assert c["created"] == chunks[0]["created"]
        assert "conversation_id" not in c
    role, *content, final = chunks[:-1] if include_usage else chunks
    assert role["choices"] == [
        {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
    ]
    assert content and all(set(c["choices"][0]["delta"]) == {"content"} for c in content)
    assert all(c["choices"][0]["finish_reason"] is None for c in content)
    assert "".join(c["choices"][0]["delta"]["content"] for c in content) == "".join(PIECES)
    assert final["choices"] == [{"index": 0, "delta": {}, "logprobs": None, "finish_reason": "stop"}]
    prompt = FakeTokenizer.count(USER)
    if include_usage:
        usage = chunks[-1]
        assert usage["choices"] == []
        assert usage["usage"] == {"prompt_tokens": prompt, "completion_tokens": 4, "total_tokens": prompt + 4}
    else:
        assert all("usage" not in c for c in chunks)


async def test_non_stream_body(make_harness: MakeHarness) -> None:
    h = make_harness(factory=FakeFactory(pieces=PIECES))
    r = await h.chat()
    assert r.status_code == 200
    body = r.json()
    prompt = FakeTokenizer.count(USER)
    assert body == {
        "id": r.headers["x-request-id"],
        "object": "chat.completion",
        "created": body["created"],
        "model": "chat",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "Hello there, friend!"},
                "logprobs": None,
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": prompt, "completion_tokens": 4, "total_tokens": prompt + 4},
    }
    assert isinstance(body["created"], int) and body["created"] > 1_700_000_000


@pytest.mark.parametrize("stream", [False, True])
async def test_answer_headers(make_harness: MakeHarness, stream: bool) -> None:
    h = make_harness()
    r = await h.chat(stream=stream)
    assert re.fullmatch(r"chatcmpl-[0-9a-f]{24}", r.headers["x-request-id"])
    assert r.headers["x-model-version"] == "chat/2; alias=champion"
    assert "x-conversation-id" not in r.headers
    assert "x-brownout" not in r.headers and "x-fallback" not in r.headers

    r = await h.chat(stream=stream, conversation_id="new")
    conv = r.headers["x-conversation-id"]
    assert conv.startswith("conv_")
    if stream:
        assert {e["conversation_id"] for e in sse_events(r)[:-1]} == {conv}
    else:
        assert r.json()["conversation_id"] == conv


async def test_request_ids_are_unique_and_on_every_response(make_harness: MakeHarness) -> None:
    h = make_harness()
    ids = {(await h.chat()).headers["x-request-id"] for _ in range(3)}
    ids.add((await h.request("GET", "/healthz")).headers["x-request-id"])
    ids.add((await h.request("GET", "/v1/nothing-here")).headers["x-request-id"])
    assert len(ids) == 5


# ------------------------------------------------------------------------------------------------- error statuses


async def post_raw(h: Any, content: bytes, headers: dict[str, str] | None = None) -> httpx.Response:
    async with h.client() as c:
        headers = headers or {**h.auth(), "content-type": "application/json"}
        return await c.post("/v1/chat/completions", content=content, headers=headers)


@pytest.mark.parametrize(
    ("content", "code"),
    [(b'{"model": "chat", "messages": [', "invalid_json"), (b"", "invalid_json"), (b"\xff\xfe", "invalid_json")],
)
async def test_400_malformed_json(make_harness: MakeHarness, content: bytes, code: str) -> None:
    h = make_harness()
    error = assert_openai_error(await post_raw(h, content), 400, code)
    assert error["type"] == "invalid_request_error"
    assert "not valid JSON" in error["message"] or "not UTF-8" in error["message"]


async def test_400_json_that_is_not_an_object(make_harness: MakeHarness) -> None:
    h = make_harness()
    error = assert_openai_error(await post_raw(h, b"[1, 2]"), 400, "invalid_json")
    assert "must be a JSON object" in error["message"]


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"messages": USER}, "model"),
        ({"model": "chat"}, "messages"),
        ({"model": "chat", "messages": []}, "messages"),
        ({"model": "chat", "messages": [{"role": "wizard", "content": "hi"}]}, "messages.0.role"),
        ({"model": "chat", "messages": USER, "temperature": 3}, "temperature"),
        ({"model": "chat", "messages": USER, "max_tokens": 0}, "max_tokens"),
        ({"model": "chat", "messages": USER, "stream": "sometimes"}, "stream"),
        ({"model": "chat", "messages": USER, "logit_bias": {"hello": 5}}, "logit_bias"),
    ],
)
async def test_422_schema_names_the_param(make_harness: MakeHarness, body: dict[str, Any], param: str) -> None:
    h = make_harness()
    async with h.client() as c:
        r = await c.post("/v1/chat/completions", json=body, headers=h.auth())
    error = assert_openai_error(r, 422, "invalid_value", param)
    assert error["message"].startswith(f"Invalid request: {param}: ")


@pytest.mark.parametrize(
    ("extra", "param"),
    [({"n": 2}, "n"), ({"tool_choice": "required"}, "tool_choice")],  # tools: test_tools.py
)
async def test_400_unsupported_parameter(make_harness: MakeHarness, extra: dict[str, Any], param: str) -> None:
    h = make_harness()
    assert_openai_error(await h.chat(**extra), 400, None, param)
    assert all(not e.requests for e in h.engines())


async def test_400_context_length_exceeded(make_harness: MakeHarness) -> None:
    h = make_harness(factory=FakeFactory(max_model_len=32))
    error = assert_openai_error(await h.chat(" ".join(["word"] * 40)), 400, "context_length_exceeded", "messages")
    assert "maximum context length is 32 tokens" in error["message"]
    assert all(not e.requests for e in h.engines())


@pytest.mark.parametrize(
    "authorization",
    [None, "", "lc-not-a-bearer-header", "Bearer ", "Bearer lc-wrong", "Basic dXNlcjpwYXNz"],
)
async def test_401_missing_or_invalid_key(make_harness: MakeHarness, authorization: str | None) -> None:
    h = make_harness()
    headers = {} if authorization is None else {"authorization": authorization}
    async with h.client() as c:
        r = await c.post("/v1/chat/completions", json={"model": "chat", "messages": USER}, headers=headers)
    error = assert_openai_error(r, 401, "invalid_api_key")
    assert error["type"] == "authentication_error"
    assert all(not e.requests for e in h.engines())
    assert await h.log() == []  # nothing to attribute a 401 to


async def test_401_revoked_key(make_harness: MakeHarness) -> None:
    h = make_harness()
    assert (await h.chat()).status_code == 200
    h.runtime.gateway.store.revoke_key(h.key.id)
    error = assert_openai_error(await h.chat(), 401, "invalid_api_key")
    assert "revoked" in error["message"]


async def test_keys_not_required(make_harness: MakeHarness) -> None:
    h = make_harness(serving={"api_keys": {"required": False}})
    async with h.client() as c:
        r = await c.post("/v1/chat/completions", json={"model": "chat", "messages": USER})
    assert r.status_code == 200
    assert r.json()["choices"][0]["message"]["content"] == "Hello there!"


@pytest.mark.parametrize("model", ["gpt-4o", "chat@nope", "chat/99", "other/1"])
async def test_404_unknown_model(make_harness: MakeHarness, model: str) -> None:
    h = make_harness()
    error = assert_openai_error(await h.chat(model=model), 404, "model_not_found")
    assert error["type"] == "not_found_error"
    assert f"The model {model!r} does not exist" in error["message"]
    assert "GET /v1/models" in error["message"]


async def test_404_other_tenants_conversation(make_harness: MakeHarness) -> None:
    h = make_harness()
    conv = (await h.chat(conversation_id="new")).headers["x-conversation-id"]
    await h.runtime.gateway.drain()
    error = assert_openai_error(
        await h.chat("and now?", conversation_id=conv, secret=h.other_secret), 404, "conversation_not_found"
    )
    assert conv in error["message"]
    assert (await h.chat("and now?", conversation_id=conv)).status_code == 200  # its owner continues it


async def test_429_requests_per_minute_with_retry_after(make_harness: MakeHarness) -> None:
    h = make_harness()
    _, secret = h.runtime.gateway.store.create_key("limited", requests_per_minute=2)
    assert [(await h.chat(secret=secret)).status_code for _ in range(2)] == [200, 200]
    r = await h.chat(secret=secret)
    error = assert_openai_error(r, 429, "rate_limit_requests")
    assert error["type"] == "rate_limit_error"
    assert 1 <= int(r.headers["retry-after"]) <= 60
    assert (await h.chat()).status_code == 200  # another key is not limited


async def test_429_request_too_large_without_retry_after(make_harness: MakeHarness) -> None:
    h = make_harness()
    _, secret = h.runtime.gateway.store.create_key("tiny", tokens_per_minute=100)
    r = await h.chat(secret=secret, max_tokens=200)
    error = assert_openai_error(r, 429, "request_too_large")
    assert "retry-after" not in r.headers
    assert "more than the key's whole limit of 100 tokens per minute" in error["message"]
    assert (await h.chat(secret=secret, max_tokens=50)).status_code == 200


@pytest.mark.parametrize("stream", [False, True])
async def test_503_when_primary_is_dead_and_no_fallback_is_ready(make_harness: MakeHarness, stream: bool) -> None:
    h = make_harness()
    h.primary.state = "dead"
    h.fallback.state = "starting"
    error = assert_openai_error(await h.chat(stream=stream), 503, "engine_unavailable")
    assert error["type"] == "service_unavailable"
    assert "chat/2 is unavailable (engine dead)" in error["message"]


async def test_503_while_engines_are_loading(make_harness: MakeHarness) -> None:
    h = make_harness(load=False)
    error = assert_openai_error(await h.chat(), 503, "engine_unavailable")
    assert "still loading" in error["message"]
    assert_openai_error(await h.request("GET", "/v1/models"), 503, "engine_unavailable")


async def test_404_unknown_path_is_openai_shaped(make_harness: MakeHarness) -> None:
    h = make_harness()
    r = await h.request("GET", "/v1/nothing-here")
    assert r.status_code == 404
    assert r.json()["error"]["type"] == "not_found_error"
    assert "/v1/nothing-here" in r.json()["error"]["message"]


# ------------------------------------------------------------------------------------------------- other routes


async def test_models_lists_served_name_aliases_and_versions(make_harness: MakeHarness) -> None:
    h = make_harness()
    await h.chat(model="chat/4")  # loaded on demand
    r = await h.request("GET", "/v1/models")
    assert r.status_code == 200
    data = r.json()["data"]
    assert [m["id"] for m in data] == ["chat", "chat@champion", "chat@previous-champion", "chat/1", "chat/2", "chat/4"]
    assert data[0]["x_model_version"] == "chat/2; alias=champion"
    assert data[1]["x_model_version"] == "chat/2"
    assert data[2]["x_model_version"] == "chat/1"
    assert all(m["object"] == "model" and m["owned_by"] == "chat-lifecycle" for m in data)
    # our extensions: the engine's context window and the configured price of a replica-hour (serving.cost)
    assert [m["x_context_window"] for m in data] == [512, 512, 512, 512, 512, 512]
    price = h.runtime.gateway.cfg.cost
    assert {(m["x_hardware"], m["x_price_usd_per_replica_hour"]) for m in data} == {
        (price.hardware, price.price_usd_per_replica_hour)
    }
    assert_openai_error(await h.request("GET", "/v1/models", secret="lc-wrong"), 401, "invalid_api_key")


async def test_healthz_and_page(make_harness: MakeHarness) -> None:
    h = make_harness(load=False)
    assert (await h.request("GET", "/healthz")).json() == {"status": "alive"}
    page = await h.request("GET", "/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")


async def test_readyz_states(make_harness: MakeHarness) -> None:
    h = make_harness()
    r = await h.request("GET", "/readyz")
    assert r.status_code == 200
    body = r.json()
    assert (body["status"], body["primary"], body["fallback"]) == (
        "ready",
        "chat/2; alias=champion",
        "chat/1; alias=previous-champion",
    )
    assert body["engines"][PRIMARY_KEY] == {"state": "ready", "queue_depth": 0, "in_flight": 0, "pids": []}

    h.primary.state = "dead"
    r = await h.request("GET", "/readyz")
    assert (r.status_code, r.json()["status"]) == (200, "degraded")
    assert "chat/2's engine is dead; 'chat' is answered by chat/1" in r.json()["reason"]

    h.fallback.state = "dead"
    r = await h.request("GET", "/readyz")
    assert (r.status_code, r.json()["status"]) == (503, "unavailable")
    assert r.json()["engines"][FALLBACK_KEY]["state"] == "dead"


async def test_readyz_before_load_and_after_a_failed_load(make_harness: MakeHarness) -> None:
    h = make_harness(load=False, factory=FakeFactory(fail_keys={FALLBACK_KEY}))
    r = await h.request("GET", "/readyz")
    assert (r.status_code, r.json()["status"], r.json()["error"]) == (503, "starting", None)
    h.runtime.load()
    r = await h.request("GET", "/readyz")
    assert (r.status_code, r.json()["status"]) == (503, "failed")
    assert r.json()["error"] == f"RuntimeError: engine {FALLBACK_KEY} failed to start"
    assert_openai_error(await h.chat(), 503, "engine_unavailable")


async def test_metrics_count_requests_and_engines(make_harness: MakeHarness) -> None:
    h = make_harness()
    await h.chat()
    await h.chat(model="nope")
    await h.runtime.gateway.drain()
    text = (await h.request("GET", "/metrics")).text
    assert 'lifecycle_requests_total{model_version="chat/2",route="primary",status="ok"} 1.0' in text
    assert f'lifecycle_engine_up{{engine="{engine_label(PRIMARY_KEY)}"}} 1.0' in text
    assert 'lifecycle_tokens_total{kind="completion",model_version="chat/2"} 3.0' in text
    # cost: busy seconds, the price and the cost per 1M tokens per version (the names Prometheus rules read)
    price = h.runtime.gateway.cfg.cost
    sample = h.runtime.gateway.metrics.registry.get_sample_value
    busy = sample("lifecycle_engine_busy_seconds_total", {"model_version": "chat/2"})
    assert busy is not None and busy > 0
    labels = {"model_version": "chat/2", "hardware": price.hardware}
    assert sample("lifecycle_price_usd_per_replica_hour", labels) == price.price_usd_per_replica_hour
    per_million = sample("lifecycle_cost_usd_per_million_tokens", {"model_version": "chat/2"})
    assert per_million == pytest.approx(busy / 3600 * price.price_usd_per_replica_hour / 3 * 1e6)


async def test_error_metric_counts_a_refused_request_once(make_harness: MakeHarness) -> None:
    h = make_harness()
    await h.chat(model="nope")
    errors = h.runtime.gateway.metrics.registry.get_sample_value(
        "lifecycle_errors_total", {"status": "404", "code": "model_not_found"}
    )
    assert errors == 1.0


async def test_conversation_routes_are_per_tenant(make_harness: MakeHarness) -> None:
    h = make_harness()
    first = (await h.chat("first question", conversation_id="new")).headers["x-conversation-id"]
    second = (await h.chat("second question", conversation_id="new")).headers["x-conversation-id"]
    await h.runtime.gateway.drain()

    listed = (await h.request("GET", "/v1/conversations")).json()
    assert [c["id"] for c in listed["data"]] == [second, first]
    assert all("messages" not in c for c in listed["data"])
    assert (await h.request("GET", "/v1/conversations", secret=h.other_secret)).json()["data"] == []

    got = (await h.request("GET", f"/v1/conversations/{first}")).json()
    assert (got["id"], got["model"], got["object"]) == (first, "chat", "conversation")
    assert [(m["role"], m["content"]) for m in got["messages"]] == [
        ("user", "first question"),
        ("assistant", "Hello there!"),
    ]
    assert got["messages"][1]["model_version"] == "chat/2"

    for method in ("GET", "DELETE"):
        r = await h.request(method, f"/v1/conversations/{first}", secret=h.other_secret)
        assert_openai_error(r, 404, "conversation_not_found")
    deleted = await h.request("DELETE", f"/v1/conversations/{first}")
    assert deleted.json() == {"id": first, "object": "conversation.deleted", "deleted": True}
    assert_openai_error(await h.request("GET", f"/v1/conversations/{first}"), 404, "conversation_not_found")
    # its texts left the request log at once; the other conversation's stay, and every row keeps its numbers
    logged = {r.conversation_id: r for r in h.runtime.gateway.store.request_log()}
    assert (logged[first].prompt_text, logged[first].response_text, logged[first].completion_tokens) == (None, None, 3)
    assert logged[second].prompt_text == "second question"


@pytest.mark.parametrize(("query", "status", "param"), [("limit=0", 400, "limit"), ("limit=abc", 422, "limit")])
async def test_conversation_list_validates_its_query(
    make_harness: MakeHarness, query: str, status: int, param: str
) -> None:
    h = make_harness()
    r = await h.request("GET", f"/v1/conversations?{query}")
    assert r.status_code == status
    assert r.json()["error"]["param"] == param


async def test_usage_route(make_harness: MakeHarness) -> None:
    h = make_harness()
    await h.chat()
    await h.chat(model="chat/4")
    await h.runtime.gateway.drain()
    body = (await h.request("GET", "/v1/usage")).json()
    assert body["key_id"] == h.key.id
    prompt = FakeTokenizer.count(USER)
    rows = sorted(body["data"], key=lambda row: row["model"])
    assert [(row["model"], row["requests"], row["prompt_tokens"], row["completion_tokens"]) for row in rows] == [
        ("chat/2", 1, prompt, 3),
        ("chat/4", 1, prompt, 3),
    ]
    assert rows[0]["total_tokens"] == prompt + 3
    # each answer costs its share of its version's busy engine time, priced: usage adds up to /metrics
    price = h.runtime.gateway.cfg.cost.price_usd_per_replica_hour
    for row in rows:
        busy = h.runtime.gateway.metrics.registry.get_sample_value(
            "lifecycle_engine_busy_seconds_total", {"model_version": row["model"]}
        )
        assert row["cost_usd"] > 0 and row["cost_usd"] == pytest.approx(busy / 3600 * price)
    assert (await h.request("GET", "/v1/usage", secret=h.other_secret)).json()["data"] == []
    assert (await h.request("GET", "/v1/usage?start=2000-01-01&end=2000-01-02")).json()["data"] == []
    r = await h.request("GET", "/v1/usage?start=yesterday")
    assert (r.status_code, r.json()["error"]["param"]) == (400, "start")


async def test_tenant_routes_need_a_key(make_harness: MakeHarness) -> None:
    h = make_harness(serving={"api_keys": {"required": False}})
    async with h.client() as c:
        r = await c.get("/v1/conversations")
    assert r.status_code == 400
    assert "needs an API key" in r.json()["error"]["message"]
