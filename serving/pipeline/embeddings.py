"""``POST /v1/embeddings`` on the gateway's shared embedder (``Gateway.embedder``: the bundled all-MiniLM-L6-v2 on
the CPU, the one the shadow comparison uses), with the limits and usage of a chat request:

    key -> requests/minute (serving.api) -> body -> parse -> model name -> token counts -> tokens/minute (reserved)
      -> encode (a worker thread) -> usage row (prompt tokens, on the key, the model and the UTC day)

The model is named by the embedder (``all-MiniLM-L6-v2``; another name is a 404 ``model_not_found``). A text longer
than the model reads (256 tokens, its [CLS] and [SEP] included) is a 400 ``context_length_exceeded`` rather than a
vector of a silently cut text. Usage is counted as OpenAI counts it: prompt tokens, no completion tokens. An
embeddings request writes no request-log row: that log is the chat traffic the monitoring (drift, canary
analysis, retraining) reads, and a vector is no answer to judge.
"""

from __future__ import annotations

from typing import Any

import anyio

from serving.pipeline.gateway import Gateway
from serving.state.store import ApiKey
from serving.wire.embeddings import EmbeddingRequest, embedding_list
from serving.wire.errors import bad_request, not_found
from serving.wire.protocol import validate


def parse(gw: Gateway, raw: dict[str, Any]) -> tuple[EmbeddingRequest, list[str]]:
    req = validate(EmbeddingRequest, raw)
    texts = req.texts(gw.cfg.limits)
    if req.model != gw.embedder.name:
        raise not_found(
            f"The model {req.model!r} does not exist: embeddings are served by {gw.embedder.name!r}",
            code="model_not_found",
        )
    return req, texts


async def embed(gw: Gateway, key: ApiKey | None, req: EmbeddingRequest, texts: list[str]) -> dict[str, Any]:
    """The answer to one parsed request: counted, limited, encoded and recorded."""
    counts, window = await anyio.to_thread.run_sync(_count, gw, texts)
    longest = max(range(len(counts)), key=counts.__getitem__)
    if counts[longest] > window:
        raise bad_request(
            f"This model reads at most {window} tokens per input; input {longest} has {counts[longest]}. "
            "Shorten it or split it.",
            code="context_length_exceeded",
            param="input",
        )
    tokens = sum(counts)
    gw.reserve_tokens(key, tokens)  # exact: an embedding generates nothing, so nothing is given back
    try:
        vectors = await anyio.to_thread.run_sync(gw.embedder.encode, texts)
    except BaseException:
        gw.recorder.give_back_tokens(key, tokens)
        raise
    gw.metrics.tokens.labels(gw.embedder.name, "prompt").inc(tokens)
    if key is not None:
        key_id, name = key.id, gw.embedder.name
        await anyio.to_thread.run_sync(lambda: gw.store.record_usage(key_id, name, tokens, 0))
    return embedding_list(req.model, vectors, req.encoding_format, tokens)


def _count(gw: Gateway, texts: list[str]) -> tuple[list[int], int]:
    return gw.embedder.count_tokens(texts), gw.embedder.max_tokens()
