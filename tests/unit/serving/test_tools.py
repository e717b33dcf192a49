"""Function calling on fakes: the schema each tool choice generates under (vLLM's for ``required``), tool calls read
back from the text, the non-streaming and streamed answers (``tool_calls``, ``finish_reason: tool_calls``), the
turns stored, and every bad declaration an OpenAI-shaped 400 naming the field."""

from __future__ import annotations

import json
from typing import Any

import pytest
from unit.serving.fakes import FakeFactory
from unit.serving.harness import MakeHarness, sse_events
from unit.serving.test_app import assert_openai_error

from serving.wire import tools
from serving.wire.tools import NamedToolChoice, ToolDefinition

pytestmark = pytest.mark.anyio

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
TIME = {"type": "function", "function": {"name": "get_time"}}
NAMED = {"type": "function", "function": {"name": "get_weather"}}
TOOLS = [ToolDefinition.model_validate(WEATHER), ToolDefinition.model_validate(TIME)]


def test_schemas_per_tool_choice() -> None:
    named = NamedToolChoice.model_validate(NAMED)
    assert tools.schema(TOOLS, named, None) == WEATHER["function"]["parameters"]
    required = tools.schema(TOOLS, "required", False)
    assert required is not None
    assert (required["type"], required["minItems"], required["maxItems"]) == ("array", 1, 1)
    branches = required["items"]["anyOf"]
    assert [b["properties"]["name"]["enum"] for b in branches] == [["get_weather"], ["get_time"]]
    assert branches[1]["properties"]["parameters"] == {"type": "object", "properties": {}}  # no schema: an object
    assert "maxItems" not in (tools.schema(TOOLS, "required", None) or {})
    assert tools.schema(TOOLS, "auto", None) is None and tools.schema(TOOLS, "none", None) is None
    assert tools.schema(None, None, None) is None


def test_calls_read_back_from_text() -> None:
    named = NamedToolChoice.model_validate(NAMED)
    content, calls = tools.read_calls('{"city": "Oslo"}', TOOLS, named)
    assert content is None and [(c.function.name, c.function.arguments) for c in calls] == [
        ("get_weather", '{"city": "Oslo"}')
    ]
    text = '[{"name": "get_time", "parameters": {}}, {"name": "get_weather", "parameters": {"city": "Rome"}}]'
    _, calls = tools.read_calls(text, TOOLS, "required")
    assert [(c.function.name, json.loads(c.function.arguments)) for c in calls] == [
        ("get_time", {}),
        ("get_weather", {"city": "Rome"}),
    ]
    assert len({c.id for c in calls}) == 2 and all(c.id.startswith("call_") for c in calls)
    hermes = 'Let me check. <tool_call>{"name": "get_weather", "arguments": {"city": "Oslo"}}</tool_call>'
    content, calls = tools.read_calls(hermes, TOOLS, "auto")
    assert content == "Let me check." and calls[0].function.arguments == '{"city": "Oslo"}'
    assert tools.read_calls('<tool_call>{"name": "unknown", "arguments": {}}</tool_call>', TOOLS, "auto")[1] == []
    assert tools.read_calls('{"city": "Os', TOOLS, named) == ('{"city": "Os', [])  # cut by max_tokens: text
    assert tools.render_calls(calls) == '<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo"}}</tool_call>'


async def test_named_call_answered_and_stored_then_the_loop_goes_on(make_harness: MakeHarness) -> None:
    h = make_harness(factory=FakeFactory(pieces=['{"city"', ': "Oslo"}']))
    r = await h.chat("weather in Oslo?", tools=[WEATHER, TIME], tool_choice=NAMED, conversation_id="new")
    assert r.status_code == 200, r.text
    body = r.json()
    choice = body["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["content"] is None
    [call] = choice["message"]["tool_calls"]
    assert (call["type"], call["function"]) == ("function", {"name": "get_weather", "arguments": '{"city": "Oslo"}'})
    assert h.primary.requests[-1].json_schema == WEATHER["function"]["parameters"]
    assert body["usage"]["completion_tokens"] > 0
    conv = r.headers["x-conversation-id"]
    await h.runtime.gateway.drain()
    stored = h.runtime.gateway.store.get_conversation(h.key.id, conv).messages
    assert [m["role"] for m in stored] == ["user", "assistant"]
    assert stored[1]["content"] == '<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo"}}</tool_call>'
    h.primary.pieces = ["It is sunny."]
    result = {"role": "tool", "tool_call_id": call["id"], "content": '{"sky": "sunny"}'}
    final = await h.chat(messages=[result], conversation_id=conv, tools=[WEATHER])
    assert final.json()["choices"][0] == {
        "index": 0,
        "message": {"role": "assistant", "content": "It is sunny."},
        "logprobs": None,
        "finish_reason": "stop",
    }
    assert h.primary.requests[-1].json_schema is None  # auto: free text
    prompt = h.primary.prompts()[-1]
    assert '"city": "Oslo"' in prompt and '{"sky": "sunny"}' in prompt  # the call and its result reach the model


async def test_required_calls_stream_as_one_tool_calls_delta(make_harness: MakeHarness) -> None:
    text = '[{"name": "get_time", "parameters": {}}, {"name": "get_weather", "parameters": {"city": "Rome"}}]'
    h = make_harness(factory=FakeFactory(pieces=[text[:30], text[30:]]))
    r = await h.chat("time and weather?", tools=[WEATHER, TIME], tool_choice="required", stream=True)
    events = sse_events(r)
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    deltas = [c["choices"][0]["delta"] for c in chunks]
    assert deltas[0] == {"role": "assistant", "content": ""}
    assert not any("content" in d and d["content"] for d in deltas)  # the JSON never leaks as text
    [calls] = [d["tool_calls"] for d in deltas if "tool_calls" in d]
    assert [(c["index"], c["function"]["name"]) for c in calls] == [(0, "get_time"), (1, "get_weather")]
    assert json.loads(calls[1]["function"]["arguments"]) == {"city": "Rome"}
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"
    assert h.primary.requests[-1].json_schema == tools.schema(TOOLS, "required", None)


async def test_a_post_filtered_call_is_text_not_a_call(make_harness: MakeHarness) -> None:
    h = make_harness()
    bad = h.cfg.safety.blocked_output_patterns[0]
    h.primary.pieces = ['{"city": "', bad, '"}']
    r = await h.chat("weather?", tools=[WEATHER], tool_choice=NAMED)
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "content_filter" and "tool_calls" not in choice["message"]
    assert bad not in r.text


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
        ({"tools": [WEATHER, WEATHER]}, "tools"),
        ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "frob"}}}]}, None),
        (
            {"messages": [{"role": "user", "content": "hi"}, {"role": "tool", "content": "x"}]},
            "messages.1.tool_call_id",
        ),
    ],
)
async def test_bad_declarations_are_400s_naming_the_field(
    make_harness: MakeHarness, body: dict[str, Any], param: str | None
) -> None:
    h = make_harness()
    r = await h.chat(**body)
    expected = param or "tools.0.function.parameters"
    assert_openai_error(r, 400, None, expected)
    assert h.primary.requests == []


async def test_a_bad_tool_shape_is_a_422(make_harness: MakeHarness) -> None:
    h = make_harness()
    r = await h.chat(tools=[{"type": "function", "function": {"name": "has space"}}])
    assert_openai_error(r, 422, "invalid_value", "tools.0.function.name")
