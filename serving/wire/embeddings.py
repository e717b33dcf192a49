"""OpenAI's embeddings wire format (https://platform.openai.com/docs/api-reference/embeddings): the request we
accept on ``POST /v1/embeddings`` and the list of vectors we answer.

    input: "text" | ["text", ...]          (at most limits.max_embedding_inputs, none empty)
    encoding_format: "float" (default) | "base64" (little-endian float32, what the openai client decodes)

Refused with a 400 naming the field, as OpenAI-shaped errors: token-id inputs (``[1, 2]`` or ``[[1, 2]]``: OpenAI
takes them, the shipped embedder reads text only), ``dimensions`` (the model's vectors have one size), an empty
text. Unknown fields are ignored, as on the chat route.
"""

from __future__ import annotations

import base64
from typing import Any, Literal

import numpy as np
from numpy.typing import NDArray
from pydantic import BaseModel, ConfigDict, Field

from serving.config import RequestLimits
from serving.wire.errors import bad_request


class EmbeddingRequest(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)

    model: str = Field(
        min_length=1,
        description="all-MiniLM-L6-v2, the gateway's embedder (not in GET /v1/models: that lists chat models).",
        examples=["all-MiniLM-L6-v2"],
    )
    input: str | list[str] | list[int] | list[list[int]] = Field(
        description="A text or a list of texts (token-id arrays are refused: this embedder reads text).",
        examples=["How do I reset my password?"],
    )
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(None, description="Refused: the model's vectors have one size.")
    user: str | None = None

    def texts(self, limits: RequestLimits) -> list[str]:
        """The texts to embed, or a 400 naming what is wrong with ``input`` (or ``dimensions``)."""
        if self.dimensions is not None:
            raise bad_request(
                "dimensions is not supported by this model: its vectors have one size", param="dimensions"
            )
        value = self.input
        texts = [value] if isinstance(value, str) else value
        if not texts:
            raise bad_request("input must not be empty", param="input")
        if not all(isinstance(t, str) for t in texts):
            raise bad_request("token-id arrays are not supported by this embedding model: send the text", param="input")
        if len(texts) > limits.max_embedding_inputs:
            raise bad_request(f"at most {limits.max_embedding_inputs} inputs per request", param="input")
        if any(not t for t in texts):
            raise bad_request("input must not contain an empty string", param="input")
        return texts  # type: ignore[return-value]


class EmbeddingUsage(BaseModel):
    prompt_tokens: int
    total_tokens: int


class EmbeddingData(BaseModel):
    object: str = Field(description="embedding")
    index: int
    embedding: list[float] | str = Field(description="The vector: floats, or base64 of little-endian float32")


class EmbeddingList(BaseModel):
    object: str = Field(description="list")
    data: list[EmbeddingData]
    model: str
    usage: EmbeddingUsage


def embedding_list(model: str, vectors: NDArray[np.floating[Any]], encoding: str, prompt_tokens: int) -> dict[str, Any]:
    """The answer: one ``embedding`` object per input, in order, and the usage."""
    rows = np.asarray(vectors, dtype="<f4")
    data = [EmbeddingData(object="embedding", index=i, embedding=_encoded(row, encoding)) for i, row in enumerate(rows)]
    usage = EmbeddingUsage(prompt_tokens=prompt_tokens, total_tokens=prompt_tokens)
    return EmbeddingList(object="list", data=data, model=model, usage=usage).model_dump()


def _encoded(row: NDArray[np.float32], encoding: str) -> list[float] | str:
    if encoding == "base64":
        return base64.b64encode(row.tobytes()).decode("ascii")
    return [float(x) for x in row]
