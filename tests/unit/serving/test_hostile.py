"""The gateway under hostile and careless clients, on fake engines: every client input gets a 4xx OpenAI-shaped
error before any work (sizes, media type, depth, surrogates, ranges, strict booleans, cursors), streams never
end without an error event and ``[DONE]``, unexpected failures are a 500 that does not take the connection down,
every error is counted, /metrics has bounded labels, and preparing the largest request never holds the event loop.
"""

from __future__ import annotations

import json
import threading
from typing import Any

import anyio
import httpx
import pytest
from unit.serving.fakes import FakeFactory, FakeTokenizer
from unit.serving.harness import MakeHarness, sse_events

from serving.config import RequestLimits

pytestmark = pytest.mark.anyio

USER = [{"role": "user", "content": "hello there"}]
OK = {"model": "chat", "messages": USER}


async def post(h: Any, body: Any, *, headers: dict[str, str] | None = None, path: str = "/v1/chat/completions") -> Any:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    async with h.client() as c:
        return await c.post(
            path, content=content, headers={"content-type": "application/json", **h.auth(), **(headers or {})}
        )


def error(r: httpx.Response, status: int, code: str | None = None, param: str | None = None) -> dict[str, Any]:
    assert r.status_code == status, r.text
    body = r.json()["error"]
    assert set(body) == {"message", "type", "param", "code"} and body["message"]
    if code is not None:
        assert body["code"] == code, body
    if param is not None:
        assert body["param"] == param, body
    return body  # type: ignore[no-any-return]


# ------------------------------------------------------------------------------------------------- client input


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(
    ("extra", "status", "code", "param"),
    [
        ({"seed": 2**70}, 422, "invalid_value", "seed"),
        ({"seed": -(2**64)}, 422, "invalid_value", "seed"),
        ({"logit_bias": {"99999999": 5}}, 422, "invalid_value", "logit_bias"),
        ({"logit_bias": {"12": 500}}, 422, "invalid_value", "logit_bias.12"),
        ({"logit_bias": {"-3": 5}}, 422, "invalid_value", "logit_bias"),
        ({"stop": [""]}, 422, "invalid_value", "stop"),
        ({"stop": ""}, 422, "invalid_value", "stop"),
        ({"stop": [f"s{i}" for i in range(17)]}, 400, None, "stop"),
        ({"stream_options": {"include_usage": "yes"}}, 422, "invalid_value", "stream_options.include_usage"),
        ({"messages": [{"role": "system", "content": "be brief"}]}, 400, None, "messages"),
        ({"messages": [{"role": "assistant", "content": "hi"}]}, 400, None, "messages"),
        ({"messages": USER * 257}, 400, "too_many_messages", "messages"),
    ],
)
async def test_out_of_range_input_is_a_4xx_before_any_engine_work(
    make_harness: MakeHarness, extra: dict[str, Any], status: int, code: str | None, param: str, stream: bool
) -> None:
    h = make_harness()
    r = await post(h, {**OK, "stream": stream, **extra})
    error(r, status, code, param)
    assert all(not e.requests for e in h.engines())
    (row,) = await h.log()
    assert (row.status, row.http_status) == ("error", status)  # logged with its real status, never as aborted


async def test_strict_booleans(make_harness: MakeHarness) -> None:
    h = make_harness()
    for value in ("yes", "true", 1, "1"):
        error(await post(h, {**OK, "stream": value}), 422, "invalid_value", "stream")


@pytest.mark.parametrize(
    ("content", "where"),
    [
        (b'{"model": "chat", "messages": [{"role": "user", "content": "\\ud800"}]}', "messages.0.content"),
        (b'{"model": "chat\\udfff", "messages": []}', "model"),
        (b'{"model": "chat", "messages": [{"role": "user", "content": "x"}], "user": "\\ud83d"}', "user"),
    ],
)
async def test_a_lone_surrogate_is_a_400(make_harness: MakeHarness, content: bytes, where: str) -> None:
    h = make_harness()
    body = error(await post(h, content), 400, "invalid_json", where)
    assert "surrogate" in body["message"]


async def test_a_valid_surrogate_pair_is_text(make_harness: MakeHarness) -> None:
    h = make_harness()
    r = await post(h, b'{"model": "chat", "messages": [{"role": "user", "content": "smile \\ud83d\\ude00"}]}')
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("depth", [40, 100_000])
async def test_deep_nesting_is_a_400(make_harness: MakeHarness, depth: int) -> None:
    h = make_harness()
    content = b'{"model": "chat", "messages": ' + b"[" * depth + b"]" * depth + b"}"
    body = error(await post(h, content), 400, "invalid_json")
    assert "nested more than 32 levels" in body["message"]


@pytest.mark.parametrize("literal", [b"NaN", b"Infinity", b"-Infinity"])
async def test_non_json_numbers_are_a_400(make_harness: MakeHarness, literal: bytes) -> None:
    h = make_harness()
    error(await post(h, b'{"model": "chat", "messages": [], "temperature": ' + literal + b"}"), 400, "invalid_json")


async def test_body_size_is_checked_before_reading_and_while_reading(make_harness: MakeHarness) -> None:
    h = make_harness(serving={"limits": {"max_body_bytes": 4096}})
    big = json.dumps({**OK, "messages": [{"role": "user", "content": "x" * 5000}]}).encode()
    body = error(await post(h, big), 413, "body_too_large")
    assert "4096" in body["message"]

    async def chunks() -> Any:  # no Content-Length: refused as the bytes pass the limit
        for i in range(0, len(big), 1000):
            yield big[i : i + 1000]

    async with h.client() as c:
        r = await c.post(
            "/v1/chat/completions", content=chunks(), headers={"content-type": "application/json", **h.auth()}
        )
    error(r, 413, "body_too_large")
    ok = json.dumps({**OK, "messages": [{"role": "user", "content": "x" * 3000}]}).encode()
    assert (await post(h, ok)).status_code == 200


@pytest.mark.parametrize("content_type", [None, "text/plain", "application/x-www-form-urlencoded", "application/jsonx"])
async def test_a_body_that_is_not_declared_json_is_a_415(make_harness: MakeHarness, content_type: str | None) -> None:
    h = make_harness()
    headers = {**h.auth(), **({"content-type": content_type} if content_type else {})}
    async with h.client() as c:
        for path in ("/v1/chat/completions", "/v1/completions"):
            r = await c.post(path, content=json.dumps({**OK, "prompt": "hi"}).encode(), headers=headers)
            error(r, 415, "unsupported_media_type")
    r = await post(h, OK, headers={"content-type": "application/json; charset=utf-8"})
    assert r.status_code == 200


@pytest.mark.parametrize("before", ["bogus", "", "conv_000000000000000000000000"])
async def test_a_bad_conversation_cursor_is_a_400(make_harness: MakeHarness, before: str) -> None:
    h = make_harness()
    theirs = (await h.chat("hello", conversation_id="new", secret=h.other_secret)).headers["x-conversation-id"]
    for cursor in (before, theirs):  # another key's conversation looks exactly like a missing one
        r = await h.request("GET", "/v1/conversations", params={"before": cursor})
        body = error(r, 400, "invalid_cursor", "before")
        assert repr(cursor) in body["message"]


# ------------------------------------------------------------------------------------------------- failures


async def test_a_stream_that_fails_after_its_200_ends_with_an_error_event_and_done(make_harness: MakeHarness) -> None:
    h = make_harness(factory=FakeFactory(pieces=["Hello", " there", " friend"]))
    h.primary.failing_adapters.add("chat/2")  # raises RuntimeError after the first delta
    r = await h.chat(stream=True)
    assert r.status_code == 200
    events = sse_events(r)
    assert events[-1] == "[DONE]"
    err = events[-2]["error"]
    assert (err["type"], err["code"]) == ("server_error", "internal_error")
    assert r.headers["x-request-id"] in err["message"]
    (row,) = await h.log()
    assert (row.status, row.http_status) == ("error", 500)
    assert row.error is not None and "RuntimeError" in row.error
    assert _sample(h, "lifecycle_errors_total", status="500", code="internal_error") == 1


async def test_an_unexpected_failure_is_a_500_and_is_not_re_raised(make_harness: MakeHarness) -> None:
    """``raise_app_exceptions`` is on: had the app re-raised (as Starlette's ServerErrorMiddleware does, after which
    uvicorn drops the keep-alive connection), the client here would raise instead of reading the 500."""
    h = make_harness(factory=FakeFactory(pieces=["Hello", " there", " friend"]))
    h.primary.failing_adapters.add("chat/2")
    r = await h.chat()
    body = error(r, 500, "internal_error")
    assert body["type"] == "server_error" and r.headers["x-request-id"] in body["message"]
    assert "Traceback" not in r.text
    (row,) = await h.log()
    assert (row.status, row.http_status) == ("error", 500)
    assert _sample(h, "lifecycle_errors_total", status="500", code="internal_error") == 1


async def test_503s_say_when_to_retry(make_harness: MakeHarness) -> None:
    h = make_harness(serving={"limits": {"retry_after_s": 7}})
    h.primary.state = "dead"
    h.fallback.state = "dead"
    for stream in (False, True):
        r = await h.chat(stream=stream)
        error(r, 503, "engine_unavailable")
        assert r.headers["retry-after"] == "7"


async def test_503_while_loading_says_when_to_retry(make_harness: MakeHarness) -> None:
    loading = make_harness(load=False)
    r = await loading.chat()
    error(r, 503, "engine_unavailable")
    assert r.headers["retry-after"] == "5"
    ready = await loading.request("GET", "/readyz")
    assert ready.status_code == 503 and ready.headers["retry-after"] == "5"


async def test_head_on_health_routes(make_harness: MakeHarness) -> None:
    h = make_harness()
    async with h.client() as c:
        for path in ("/readyz", "/healthz"):
            r = await c.head(path)
            assert r.status_code == 200 and r.content == b""


async def test_head_readyz_while_loading(make_harness: MakeHarness) -> None:
    loading = make_harness(load=False)
    async with loading.client() as c:
        assert (await c.head("/readyz")).status_code == 503


# ------------------------------------------------------------------------------------------------- metrics


async def test_every_error_is_counted_and_labels_stay_bounded(make_harness: MakeHarness) -> None:
    h = make_harness()
    for i in range(30):
        await h.request("GET", f"/scan/{i}/admin.php")
    await h.request("GET", "/v1/conversations/conv_nope")
    await h.request("PUT", "/v1/models")
    await post(h, {**OK, "temperature": 9})
    text = (await h.request("GET", "/metrics")).text
    assert "/scan/" not in text and "admin.php" not in text and "conv_nope" not in text
    assert _sample(h, "lifecycle_http_requests_total", method="GET", route="unmatched", status="404") == 30
    assert _sample(h, "lifecycle_errors_total", status="404", code="not_found") == 30
    assert (
        _sample(
            h, "lifecycle_http_requests_total", method="GET", route="/v1/conversations/{conversation_id}", status="404"
        )
        == 1
    )
    assert _sample(h, "lifecycle_errors_total", status="404", code="conversation_not_found") == 1
    assert _sample(h, "lifecycle_errors_total", status="405", code="method_not_allowed") == 1
    assert _sample(h, "lifecycle_errors_total", status="422", code="invalid_value") == 1
    families = [line.split()[2] for line in text.splitlines() if line.startswith("# TYPE")]
    assert len(families) == len(set(families))  # each family once


async def test_metrics_token(make_harness: MakeHarness, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TEST_METRICS_TOKEN", "s3cret")
    h = make_harness(serving={"metrics": {"token_env": "TEST_METRICS_TOKEN"}})
    async with h.client() as c:
        error(await c.get("/metrics"), 401, "invalid_api_key")
        error(await c.get("/metrics", headers={"authorization": "Bearer wrong"}), 401)
        r = await c.get("/metrics", headers={"authorization": "Bearer s3cret"})
    assert r.status_code == 200 and "lifecycle_http_requests_total" in r.text


# ------------------------------------------------------------------------------------------------- the event loop


class HeldTokenizer(FakeTokenizer):
    """Rendering a conversation of more than 100 messages waits until the test lets it go (and says it started)."""

    def __init__(self) -> None:
        super().__init__()
        self.started = threading.Event()
        self.release = threading.Event()
        self.released_in_time: bool | None = None

    def apply_chat_template(self, conversation: Any, **kwargs: Any) -> Any:
        if len(conversation) > 100 and self.released_in_time is None:
            self.started.set()
            self.released_in_time = self.release.wait(10)
        return super().apply_chat_template(conversation, **kwargs)


async def test_healthz_answers_while_the_largest_request_is_prepared(make_harness: MakeHarness) -> None:
    """Ordering, not a stopwatch: /healthz is answered while the heavy request is still inside its preparation
    (held there by the tokenizer until the test releases it). On the event loop, the preparation would hold the
    loop, /healthz could not be answered, and the tokenizer would give up waiting."""
    tokenizer = HeldTokenizer()
    h = make_harness(factory=FakeFactory(tokenizer=tokenizer))
    limit = RequestLimits().max_messages
    turns = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"turn {i}"} for i in range(limit - 1)]
    heavy: list[httpx.Response] = []
    async with h.client() as c, anyio.create_task_group() as tg:

        async def send() -> None:
            heavy.append(
                await c.post("/v1/chat/completions", json={"model": "chat", "messages": turns}, headers=h.auth())
            )

        tg.start_soon(send)
        assert await anyio.to_thread.run_sync(tokenizer.started.wait, 10)
        health = await c.get("/healthz")
        assert health.status_code == 200 and not heavy  # answered while the heavy one is being prepared
        tokenizer.release.set()
    assert tokenizer.released_in_time is True
    assert heavy[0].status_code == 200


async def test_a_long_conversation_is_fitted_in_a_logarithmic_number_of_renders(make_harness: MakeHarness) -> None:
    h = make_harness(factory=FakeFactory(max_model_len=64))
    turns = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"turn number {i}"} for i in range(255)]
    tokenizer = h.primary.tokenizer
    before = tokenizer.renders
    r = await post(h, {"model": "chat", "messages": turns})
    assert r.status_code == 200
    assert tokenizer.renders - before <= 10  # 127 user turns to choose a cut from: bisection, not one by one
    (req,) = h.primary.requests
    prompt = tokenizer.decode(req.prompt_token_ids)
    assert prompt.endswith("turn number 254 <|end|> <|assistant|>") and len(req.prompt_token_ids) <= 64


def _sample(h: Any, name: str, **labels: str) -> float | None:
    return h.runtime.gateway.metrics.registry.get_sample_value(name, labels)  # type: ignore[no-any-return]
