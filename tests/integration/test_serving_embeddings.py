"""``POST /v1/embeddings`` on the live gateway (the session's ``gateway``, the real MiniLM embedder): the official
openai client's embeddings calls, float and base64, its usage counted on the key, refusals OpenAI-shaped."""

from __future__ import annotations

from typing import Any

import numpy as np
import openai
import pytest
from support.gateway_helpers import Gateway

MODEL = "all-MiniLM-L6-v2"
TEXTS = ["How do I reset my password?", "I forgot my password; how can I change it?", "Convert 3 km to metres."]


def _usage_row(client: Any) -> dict[str, Any]:
    rows = client.get("/usage", cast_to=object)["data"]
    return next((r for r in rows if r["model"] == MODEL), {"requests": 0, "prompt_tokens": 0, "completion_tokens": 0})


def test_the_openai_client_embeds_texts_in_float_and_base64(gateway: Gateway) -> None:
    client = gateway.client(gateway.other_key)
    before = _usage_row(client)
    floats = client.embeddings.create(model=MODEL, input=TEXTS, encoding_format="float")
    packed = client.embeddings.create(model=MODEL, input=TEXTS)  # the client asks for base64 and decodes it
    assert floats.model == MODEL and [d.index for d in floats.data] == [0, 1, 2]
    vectors = np.array([d.embedding for d in floats.data])
    assert vectors.shape == (3, 384)
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1, atol=1e-5)  # MiniLM's vectors are normalized
    assert np.array_equal(np.array([d.embedding for d in packed.data], dtype=np.float32), vectors.astype(np.float32))
    similar, unrelated = vectors[0] @ vectors[1], vectors[0] @ vectors[2]
    assert similar > unrelated + 0.3, (similar, unrelated)
    assert floats.usage.prompt_tokens == floats.usage.total_tokens == packed.usage.prompt_tokens > 3 * 3
    single = client.embeddings.create(model=MODEL, input=TEXTS[2], encoding_format="float")
    assert np.allclose(single.data[0].embedding, vectors[2], atol=1e-5)
    after = _usage_row(client)
    assert after["requests"] - before["requests"] == 3
    spent = 2 * floats.usage.prompt_tokens + single.usage.prompt_tokens
    assert after["prompt_tokens"] - before["prompt_tokens"] == spent
    assert after["completion_tokens"] == before["completion_tokens"]


def test_refusals_are_openai_errors(gateway: Gateway) -> None:
    client = gateway.client()
    with pytest.raises(openai.BadRequestError) as refused:
        client.embeddings.create(model=MODEL, input=[[101, 2054]], encoding_format="float")
    assert refused.value.body["param"] == "input"  # type: ignore[index]
    with pytest.raises(openai.BadRequestError) as refused:
        client.embeddings.create(model=MODEL, input="hi", dimensions=64)
    assert refused.value.body["param"] == "dimensions"  # type: ignore[index]
    with pytest.raises(openai.BadRequestError) as refused:
        client.embeddings.create(model=MODEL, input="word " * 300)
    assert refused.value.body["code"] == "context_length_exceeded"  # type: ignore[index]
    with pytest.raises(openai.NotFoundError):
        client.embeddings.create(model="chat", input="hi")
    with pytest.raises(openai.AuthenticationError):
        gateway.client("lc-not-a-key").embeddings.create(model=MODEL, input="hi")
