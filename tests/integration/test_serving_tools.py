"""Function calling on the live gateway (the session's ``gateway``: a real vLLM engine and its structured outputs):
the official openai client's tool loop, unmodified - a call the model makes, our tool run on its arguments, the tool
message sent back, the final answer - streamed and not, with a named function (and `required`, not streamed). The tiny
model knows nothing of tools: the grammar alone makes its arguments parse and validate against the schema."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
from support.gateway_helpers import Gateway

PARAMETERS = {
    "type": "object",
    # enums: a random model under a grammar would otherwise write digits or letters until max_tokens
    "properties": {
        "city": {"type": "string", "enum": ["Oslo", "Rome", "Lima"]},
        "days": {"type": "integer", "enum": [1, 2, 3]},
    },
    "required": ["city", "days"],
    "additionalProperties": False,
}
TOOLS: list[Any] = [
    {"type": "function", "function": {"name": "get_weather", "description": "The forecast", "parameters": PARAMETERS}}
]
NAMED: Any = {"type": "function", "function": {"name": "get_weather"}}
QUESTION: list[Any] = [{"role": "user", "content": "What is the weather in Oslo for the next 2 days?"}]


def get_weather(city: str, days: int) -> dict[str, Any]:
    """Our tool: what the loop runs on the model's arguments."""
    return {"city": city, "days": days, "sky": "sunny"}


def _run(call: Any) -> dict[str, Any]:
    assert call.type == "function" and call.function.name == "get_weather"
    arguments = json.loads(call.function.arguments)
    jsonschema.validate(arguments, PARAMETERS)  # the grammar's promise
    return {"role": "tool", "tool_call_id": call.id, "content": json.dumps(get_weather(**arguments))}


def test_the_openai_tool_loop_with_a_named_function_and_required(gateway: Gateway) -> None:
    client = gateway.client()
    for choice in (NAMED, "required"):  # required: an array of calls (one: parallel_tool_calls false)
        messages = list(QUESTION)
        first = client.chat.completions.create(
            model="chat",
            messages=messages,
            tools=TOOLS,
            tool_choice=choice,
            parallel_tool_calls=False,
            max_tokens=128,
            temperature=0,
        )
        message = first.choices[0].message
        assert first.choices[0].finish_reason == "tool_calls", (first.choices[0].message.content or "")[:400]
        assert message.content is None and message.tool_calls and len(message.tool_calls) == 1
        assert first.usage is not None and first.usage.completion_tokens > 0
        messages.append(message)  # the client's own message object goes back, as its docs do
        messages.append(_run(message.tool_calls[0]))
        final = client.chat.completions.create(model="chat", messages=messages, tools=TOOLS, max_tokens=8)
        assert final.choices[0].finish_reason in ("stop", "length")
        assert final.choices[0].message.tool_calls is None and final.choices[0].message.content
        assert final.usage is not None and final.usage.prompt_tokens > first.usage.prompt_tokens


def test_the_streamed_tool_loop(gateway: Gateway) -> None:
    client = gateway.client()
    messages = list(QUESTION)
    stream = client.chat.completions.create(
        model="chat",
        messages=messages,
        tools=TOOLS,
        tool_choice=NAMED,
        max_tokens=48,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    calls: dict[int, dict[str, str]] = {}
    finish, usage, content = None, None, ""
    for chunk in stream:  # the accumulation OpenAI's function-calling guide shows
        usage = chunk.usage or usage
        for choice in chunk.choices:
            content += choice.delta.content or ""
            finish = choice.finish_reason or finish
            for delta in choice.delta.tool_calls or []:
                acc = calls.setdefault(delta.index, {"id": "", "name": "", "arguments": ""})
                acc["id"] = delta.id or acc["id"]
                if delta.function is not None:
                    acc["name"] += delta.function.name or ""
                    acc["arguments"] += delta.function.arguments or ""
    assert finish == "tool_calls", content[:400]
    assert content == "" and list(calls) == [0]
    assert usage is not None and usage.completion_tokens > 0
    call = calls[0]
    arguments = json.loads(call["arguments"])
    jsonschema.validate(arguments, PARAMETERS)
    assistant = {
        "role": "assistant",
        "tool_calls": [
            {"id": call["id"], "type": "function", "function": {"name": call["name"], "arguments": call["arguments"]}}
        ],
    }
    result = {"role": "tool", "tool_call_id": call["id"], "content": json.dumps(get_weather(**arguments))}
    final = client.chat.completions.create(
        model="chat", messages=[*messages, assistant, result], tools=TOOLS, max_tokens=8, stream=True
    )
    reasons = [c.choices[0].finish_reason for c in final if c.choices and c.choices[0].finish_reason]
    assert reasons in (["stop"], ["length"])
