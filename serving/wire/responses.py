"""The OpenAI wire format of the gateway's answers: one pydantic model per JSON object it sends, our extensions
marked as such. The routes and the streaming pipeline build every answer from these (``dump``: the fields set, in
the model's order), and the OpenAPI document (``serving.wire.openapi``) describes the same models.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from serving.wire.tools import ToolCall


class ErrorObject(BaseModel):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorResponse(BaseModel):
    """Every error answer: OpenAI's shape."""

    error: ErrorObject


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class ChatMessageOut(BaseModel):
    role: str
    content: str | None = Field(description="The reply's text; null when it is only tool calls.")
    tool_calls: list[ToolCall] | None = None


class ChatChoice(BaseModel):
    index: int
    message: ChatMessageOut
    logprobs: None
    finish_reason: str | None


class ChatCompletion(BaseModel):
    id: str
    object: str = Field(description="chat.completion")
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage
    conversation_id: str | None = Field(None, description="Extension: the stored conversation, when there is one.")


class CompletionLogprobs(BaseModel):
    tokens: list[str]
    token_logprobs: list[float | None]
    top_logprobs: list[dict[str, float] | None]
    text_offset: list[int]


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: CompletionLogprobs | None
    finish_reason: str | None


class Completion(BaseModel):
    id: str
    object: str = Field(description="text_completion")
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage


class ModelCard(BaseModel):
    id: str
    object: str
    created: int
    owned_by: str
    x_model_version: str | None = None
    # our extensions (x_), like x_model_version: the engine's context window in tokens (None: not loaded), the
    # hardware an engine replica is priced as and its price per replica-hour (serving.cost)
    x_context_window: int | None = None
    x_hardware: str | None = None
    x_price_usd_per_replica_hour: float | None = None


class ModelList(BaseModel):
    object: str
    data: list[ModelCard]


class StoredMessageOut(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: str
    content: str
    created_at: str
    model_version: str | None = None
    filtered: str | None = Field(None, description="A blocked exchange: kept out of later turns' context.")


class ConversationOut(BaseModel):
    id: str
    object: str
    created: int
    model: str
    messages: list[StoredMessageOut] | None = None


class ConversationList(BaseModel):
    object: str
    data: list[ConversationOut]


class ConversationDeleted(BaseModel):
    id: str
    object: str
    deleted: bool


class UsageDay(BaseModel):
    date: str
    model: str
    requests: int
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    cost_usd: float = Field(
        0.0,
        description="The requests' shares of their engines' busy time, priced per replica-hour (serving.cost); "
        "summed per key, model and day.",
    )


class UsageList(BaseModel):
    object: str
    key_id: str
    data: list[UsageDay]


class FeedbackOut(BaseModel):
    object: str = Field(description="feedback")
    response_id: str
    rating: int = Field(description="1 (thumbs up) or -1 (thumbs down)")
    better_answer: bool = Field(description="Whether a better answer was stored with it.")
    reason: str | None = Field(
        None, description="Why a thumbs down, as given: unsafe, wrong_refusal, incorrect, other."
    )
    model_version: str | None = Field(description="The version that wrote the rated answer.")
    created: int


class Health(BaseModel):
    status: str


class Readiness(BaseModel):
    model_config = ConfigDict(extra="allow")
    status: str = Field(description="ready, degraded, starting, failed or unavailable")


class ChatChunkChoice(BaseModel):
    index: int
    delta: dict[str, Any] = Field(description="role, content, or tool_calls (index, id, type, function)")
    logprobs: None
    finish_reason: str | None


class ChatCompletionChunk(BaseModel):
    """One server-sent event of a streamed chat completion; the last before ``[DONE]`` may carry only ``usage``."""

    id: str
    object: str = Field(description="chat.completion.chunk")
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None
    conversation_id: str | None = Field(None, description="Extension: the stored conversation, when there is one.")


class CompletionChunk(BaseModel):
    """One server-sent event of a streamed text completion; the last before ``[DONE]`` may carry only ``usage``."""

    id: str
    object: str = Field(description="text_completion")
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None


def dump(model: BaseModel) -> dict[str, Any]:
    """The JSON object of an answer: the fields it was built with (an optional field left out stays out, one set
    to None is null), in the model's order."""
    return model.model_dump(exclude_unset=True)
