"""OpenAI Chat Completions wire format: the request schema we accept and the response/chunk objects we send.

Follows https://platform.openai.com/docs/api-reference/chat. Unknown request fields are ignored (as OpenAI-
compatible servers do, so newer clients keep working); fields we cannot honour (``n`` > 1, logprobs) are
a 400 naming the field instead of being silently dropped. ``tools`` and ``tool_choice`` are OpenAI's function
calling (``serving.wire.tools``). Values are checked where the client sent them, not
where they would fail later: types are strict (``"stream": "yes"`` or ``1`` is a 422, not true; ``"n": "1"``
or ``1.0`` is not an integer, ``false`` is not a number), ``seed`` fits a
signed 64-bit integer, ``logit_bias`` values lie in [-100, 100] and its keys are token ids (checked against the
served model's vocabulary by the gateway), stop strings are non-empty, and a conversation has a user turn.
``SamplingRequest`` holds what chat and text completions (``serving.api.completions``) share.

Our extension, marked as such: ``conversation_id`` in the request continues a stored conversation (the value
``"new"`` starts one); the response carries ``conversation_id`` and the ``x-conversation-id`` header.
"""

from __future__ import annotations

import time
from typing import Annotated, Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StringConstraints, ValidationError, field_validator

from serving.config import RequestLimits
from serving.wire import responses
from serving.wire import tools as function_calling
from serving.wire.errors import bad_request, invalid
from serving.wire.tools import ToolCall, ToolChoice, ToolDefinition

NEW_CONVERSATION = "new"
SEED_MIN, SEED_MAX = -(2**63), 2**63 - 1  # what the engine's random generator takes
TokenId = Annotated[str, StringConstraints(pattern=r"^[0-9]+$")]  # logit_bias keys: token ids, as JSON strings
Bias = Annotated[float, Field(ge=-100, le=100)]
StopString = Annotated[str, Field(min_length=1)]  # an empty stop string would end every reply at once


class TextPart(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None  # an assistant turn's calls
    tool_call_id: str | None = None  # a tool turn: the call it answers

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)

    def plain(self) -> dict[str, str]:
        """The message as the chat template sees it (developer is the newer name of system; an assistant turn's
        tool calls as their hermes text, ``serving.wire.tools.render_calls``)."""
        text = self.text()
        if self.tool_calls:
            text = "\n".join(part for part in (text, function_calling.render_calls(self.tool_calls)) if part)
        return {"role": "system" if self.role == "developer" else self.role, "content": text}


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    include_usage: StrictBool = False


class SamplingRequest(BaseModel):
    """The fields chat and text completions share: the model, streaming and sampling."""

    model_config = ConfigDict(extra="ignore", strict=True)

    model: str = Field(
        min_length=1,
        description="chat, NAME@ALIAS or NAME/VERSION (GET /v1/models lists them).",
        examples=["chat", "chat@champion"],
    )
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    max_tokens: int | None = Field(None, ge=1, examples=[16])
    temperature: float = Field(1.0, ge=0, le=2)
    top_p: float = Field(1.0, gt=0, le=1)
    seed: int | None = Field(None, ge=SEED_MIN, le=SEED_MAX)
    stop: StopString | list[StopString] | None = None
    presence_penalty: float = Field(0.0, ge=-2, le=2)
    frequency_penalty: float = Field(0.0, ge=-2, le=2)
    logit_bias: (
        dict[Annotated[str, StringConstraints(pattern=r"^[0-9]+$")], Annotated[float, Field(ge=-100, le=100)]] | None
    ) = Field(None, description="Token id (as a string) -> bias in [-100, 100] added to its logit.")
    n: int = Field(1, ge=1)
    user: str | None = None

    @field_validator("stop")
    @classmethod
    def _stops(cls, value: str | list[str] | None) -> list[str] | None:
        if value is None:
            return None
        return [value] if isinstance(value, str) else value

    def requested_max_tokens(self) -> int | None:
        return self.max_tokens

    def bias_ids(self) -> dict[int, float]:
        return {int(k): v for k, v in (self.logit_bias or {}).items()}

    def check_sampling(self, limits: RequestLimits) -> None:
        if self.n != 1:
            raise bad_request("only n=1 is supported", param="n")
        stops = self.stop or []
        if len(stops) > limits.max_stop_sequences:
            raise bad_request(f"at most {limits.max_stop_sequences} stop sequences are allowed", param="stop")


class ChatCompletionRequest(SamplingRequest):
    messages: list[ChatMessage] = Field(
        min_length=1, examples=[[{"role": "user", "content": "What is 2 + 2?"}]], description="The conversation."
    )
    max_completion_tokens: int | None = Field(None, ge=1)
    tools: list[ToolDefinition] | None = None
    tool_choice: ToolChoice | None = Field(
        None, description="none, auto (the default with tools), required, or a named function."
    )
    parallel_tool_calls: StrictBool | None = None
    logprobs: StrictBool | None = None
    # --- our extension ---
    conversation_id: str | None = Field(
        None, description="Extension: continue this stored conversation ('new' starts one)."
    )

    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    def tool_mode(self) -> str:
        """none, auto, required or named (``serving.wire.tools``)."""
        return function_calling.mode(self.tools, self.tool_choice)

    def tool_schema(self) -> dict[str, Any] | None:
        """The JSON schema the reply is generated under (named and required tool choices), else None."""
        return function_calling.schema(self.tools, self.tool_choice, self.parallel_tool_calls)

    def check_supported(self, limits: RequestLimits) -> None:
        self.check_sampling(limits)
        try:
            function_calling.check(self.tools, self.tool_choice)
        except function_calling.ToolDeclarationError as exc:
            raise bad_request(str(exc), param=exc.param) from None
        for i, m in enumerate(self.messages):
            if m.role == "tool" and not m.tool_call_id:
                raise bad_request(
                    "a tool message needs the tool_call_id it answers", param=f"messages.{i}.tool_call_id"
                )
        if self.logprobs:
            raise bad_request("logprobs are not supported by this endpoint", param="logprobs")
        if len(self.messages) > limits.max_messages:
            raise bad_request(
                f"{len(self.messages)} messages; a request may carry at most {limits.max_messages}",
                code="too_many_messages",
                param="messages",
            )
        if not any(m.role in ("user", "tool") for m in self.messages):  # a tool result is answered too
            raise bad_request("the messages need at least one user (or tool) turn to answer", param="messages")


def usage(prompt_tokens: int, completion_tokens: int) -> responses.Usage:
    return responses.Usage(
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        total_tokens=prompt_tokens + completion_tokens,
    )


def completion(
    request_id: str,
    model: str,
    text: str | None,
    finish_reason: str | None,
    prompt_tokens: int,
    completion_tokens: int,
    conversation_id: str | None,
    created: int | None = None,
    tool_calls: list[ToolCall] | None = None,
) -> dict[str, Any]:
    message = responses.ChatMessageOut(role="assistant", content=text)
    if tool_calls:
        message.tool_calls = tool_calls
    body = responses.ChatCompletion(
        id=request_id,
        object="chat.completion",
        created=created or int(time.time()),
        model=model,
        choices=[responses.ChatChoice(index=0, message=message, logprobs=None, finish_reason=finish_reason)],
        usage=usage(prompt_tokens, completion_tokens),
    )
    if conversation_id:
        body.conversation_id = conversation_id
    return responses.dump(body)


def chunk(
    request_id: str,
    model: str,
    created: int,
    delta: dict[str, Any],
    finish_reason: str | None = None,
    conversation_id: str | None = None,
) -> dict[str, Any]:
    choice = responses.ChatChunkChoice(index=0, delta=delta, logprobs=None, finish_reason=finish_reason)
    body = responses.ChatCompletionChunk(
        id=request_id, object="chat.completion.chunk", created=created, model=model, choices=[choice]
    )
    if conversation_id:
        body.conversation_id = conversation_id
    return responses.dump(body)


def usage_chunk(
    request_id: str, model: str, created: int, prompt_tokens: int, completion_tokens: int
) -> dict[str, Any]:
    body = responses.ChatCompletionChunk(
        id=request_id,
        object="chat.completion.chunk",
        created=created,
        model=model,
        choices=[],
        usage=usage(prompt_tokens, completion_tokens),
    )
    return responses.dump(body)


M = TypeVar("M", bound=BaseModel)


def validate(model: type[M], raw: dict[str, Any]) -> M:
    """``raw`` as a request model, or a 422 naming the first field that breaks it."""
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = list(first["loc"])
        if "[key]" in loc:  # a bad dict key: name the field, not the client's key
            loc = loc[: loc.index("[key]") - 1]
        # field names and list indexes; not pydantic's names of union members ("list[constrained-str]", "str")
        param = ".".join(str(p) for p in loc if isinstance(p, int) or _field_name(p))
        raise invalid(f"Invalid request: {param}: {first['msg']}", param=param or None) from None


def _field_name(part: str) -> bool:
    return (part.isidentifier() and part not in _UNION_MEMBERS) or part.isdigit()


_UNION_MEMBERS = frozenset({"str", "int", "float", "bool"})  # how pydantic names a union's plain members in a loc
