"""``POST /v1/embeddings`` on fakes: OpenAI's body (float and base64 vectors, in input order), usage rows and the
token budget of the key, and every refusal an OpenAI-shaped 4xx naming the field."""

from __future__ import annotations

import base64
from typing import Any

import numpy as np
import pytest
from unit.serving.harness import MakeHarness
from unit.serving.test_app import assert_openai_error

pytestmark = pytest.mark.anyio

MODEL = "all-MiniLM-L6-v2"


async def _embed(h: Any, secret: str | None = None, **body: Any) -> Any:
    return await h.request("POST", "/v1/embeddings", json={"model": MODEL, **body}, secret=secret)


async def test_float_and_base64_vectors_in_input_order_with_usage(make_harness: MakeHarness) -> None:
    h = make_harness()
    texts = ["red apple", "green pear tree", "red apple"]
    floats = await _embed(h, input=texts)
    assert floats.status_code == 200, floats.text
    body = floats.json()
    assert (body["object"], body["model"]) == ("list", MODEL)
    assert [d["index"] for d in body["data"]] == [0, 1, 2]
    assert all(d["object"] == "embedding" for d in body["data"])
    vectors = [d["embedding"] for d in body["data"]]
    assert vectors[0] == vectors[2] != vectors[1]
    assert body["usage"] == {"prompt_tokens": 4 + 5 + 4, "total_tokens": 13}
    packed = (await _embed(h, input=texts, encoding_format="base64")).json()
    decoded = [np.frombuffer(base64.b64decode(d["embedding"]), dtype="<f4").tolist() for d in packed["data"]]
    assert decoded == vectors
    one = (await _embed(h, input="green pear tree")).json()
    assert one["data"][0]["embedding"] == vectors[1] and one["usage"]["prompt_tokens"] == 5
    usage = h.runtime.gateway.store.usage(h.key.id)
    assert [(u.model, u.requests, u.prompt_tokens, u.completion_tokens) for u in usage] == [(MODEL, 3, 31, 0)]
    assert await h.log() == []  # the request log is chat traffic: monitoring reads it


@pytest.mark.parametrize(
    ("body", "status", "code", "param"),
    [
        ({"input": [1, 2, 3]}, 400, None, "input"),
        ({"input": [[1, 2], [3]]}, 400, None, "input"),
        ({"input": []}, 400, None, "input"),
        ({"input": ["fine", ""]}, 400, None, "input"),
        ({"input": "x", "dimensions": 128}, 400, None, "dimensions"),
        ({"input": "x", "encoding_format": "int8"}, 422, "invalid_value", "encoding_format"),
        ({"input": ["x"] * 9}, 400, None, "input"),
        ({"input": "word " * 15}, 400, "context_length_exceeded", "input"),
        ({"input": "x", "model": "text-embedding-3-small"}, 404, "model_not_found", None),
        ({"input": 5}, 422, "invalid_value", "input"),
    ],
)
async def test_refusals_are_openai_shaped(
    make_harness: MakeHarness, body: dict[str, Any], status: int, code: str | None, param: str | None
) -> None:
    h = make_harness(serving={"limits": {"max_embedding_inputs": 8}})
    r = await h.request("POST", "/v1/embeddings", json={"model": MODEL, **body})
    error = assert_openai_error(r, status, code, param)
    assert error["message"]
    assert h.embedder.calls == []  # refused before any work
    assert h.runtime.gateway.store.usage(h.key.id) == []


async def test_keys_and_the_token_budget_apply(make_harness: MakeHarness) -> None:
    h = make_harness(serving={"api_keys": {"tokens_per_minute": 10}})
    assert_openai_error(await _embed(h, secret="lc-wrong", input="x"), 401, "invalid_api_key")
    assert (await _embed(h, input="one two three")).status_code == 200  # 5 tokens of 10
    r = await _embed(h, input="four five six seven")  # 6 more: over the minute's budget
    assert_openai_error(r, 429, "rate_limit_tokens")
    assert int(r.headers["retry-after"]) >= 1
    assert [u.prompt_tokens for u in h.runtime.gateway.store.usage(h.key.id)] == [5]
