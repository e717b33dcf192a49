"""OpenAI Chat Completions wire format: the request schema we accept and the response/chunk objects we send.

Follows https://platform.openai.com/docs/api-reference/chat. Unknown request fields are ignored (as OpenAI-
compatible servers do, so newer clients keep working); fields we cannot honour (``n`` > 1, tools, logprobs) are
a 400 naming the field instead of being silently dropped.

Our extension, marked as such: ``conversation_id`` in the request continues a stored conversation (the value
``"new"`` starts one); the response carries ``conversation_id`` and the ``x-conversation-id`` header.
"""

from __future__ import annotations

import time
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from serving.errors import bad_request

NEW_CONVERSATION = "new"


class TextPart(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)

    def plain(self) -> dict[str, str]:
        """The message as the chat template sees it (developer is the newer name of system)."""
        return {"role": "system" if self.role == "developer" else self.role, "content": self.text()}


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")
    include_usage: bool = False


class ChatCompletionRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str = Field(min_length=1)
    messages: list[ChatMessage] = Field(min_length=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    temperature: float = Field(1.0, ge=0, le=2)
    top_p: float = Field(1.0, gt=0, le=1)
    seed: int | None = None
    stop: str | list[str] | None = None
    presence_penalty: float = Field(0.0, ge=-2, le=2)
    frequency_penalty: float = Field(0.0, ge=-2, le=2)
    logit_bias: dict[str, float] | None = None
    n: int = Field(1, ge=1)
    user: str | None = None
    tools: list[Any] | None = None
    logprobs: bool | None = None
    # --- our extension ---
    conversation_id: str | None = Field(
        None, description="Extension: continue this stored conversation ('new' starts one)."
    )

    @field_validator("stop")
    @classmethod
    def _stops(cls, value: str | list[str] | None) -> list[str] | None:
        if value is None:
            return None
        return [value] if isinstance(value, str) else value

    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    def check_supported(self) -> None:
        if self.n != 1:
            raise bad_request("only n=1 is supported", param="n")
        if self.tools:
            raise bad_request("tool calls are not supported by this model", param="tools")
        if self.logprobs:
            raise bad_request("logprobs are not supported by this endpoint", param="logprobs")
        if self.logit_bias:
            for token in self.logit_bias:
                if not token.lstrip("-").isdigit():
                    raise bad_request(f"logit_bias keys must be token ids, got {token!r}", param="logit_bias")


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def completion(
    request_id: str,
    model: str,
    text: str,
    finish_reason: str | None,
    prompt_tokens: int,
    completion_tokens: int,
    conversation_id: str | None,
    created: int | None = None,
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "id": request_id,
        "object": "chat.completion",
        "created": created or int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "logprobs": None,
                "finish_reason": finish_reason,
            }
        ],
        "usage": usage(prompt_tokens, completion_tokens),
    }
    if conversation_id:
        body["conversation_id"] = conversation_id
    return body


def chunk(
    request_id: str,
    model: str,
    created: int,
    delta: dict[str, str],
    finish_reason: str | None = None,
    conversation_id: str | None = None,
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "id": request_id,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}],
    }
    if conversation_id:
        body["conversation_id"] = conversation_id
    return body


def usage_chunk(
    request_id: str, model: str, created: int, prompt_tokens: int, completion_tokens: int
) -> dict[str, Any]:
    return {
        "id": request_id,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": [],
        "usage": usage(prompt_tokens, completion_tokens),
    }
