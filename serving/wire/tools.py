"""OpenAI's function calling on the chat route (https://platform.openai.com/docs/guides/function-calling): the
``tools`` and ``tool_choice`` a request declares, the JSON schema that constrains the reply, and the tool calls
read back from the generated text.

    tool_choice: {"type": "function", "function": {"name": N}}   the reply is N's arguments: vLLM's structured
                                                                 outputs hold it to N's parameters schema
                 "required"                                       one call or more: a JSON array of
                                                                 {"name", "parameters"} (vLLM's own schema for it)
                 "auto" (the default with tools)                  free text; hermes-style
                                                                 ``<tool_call>{"name", "arguments"}</tool_call>``
                                                                 blocks in it are read as calls (vLLM's hermes parser
                                                                 format); a template without a tool format (ours)
                                                                 never shows the model the tools: it answers in text
                 "none"                                           free text, no calls

The grammar makes the arguments of a named or required call always parse and validate against the tool's schema
(unless ``max_tokens`` cuts the reply: then it is text with ``finish_reason: length``). Every ``parameters`` schema
is compiled up front (xgrammar, the engine's structured-output backend), so a schema the engine cannot follow is a
400 naming the tool, never a failed generation. An assistant turn's ``tool_calls`` reach the model (and the stored
conversation) as the hermes text of ``render_calls``.
"""

from __future__ import annotations

import json
import re
import secrets
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class ToolDeclarationError(ValueError):
    """A declaration no engine could follow; the protocol answers it as a 400 naming ``param``."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


_STRICT = ConfigDict(extra="ignore", strict=True)
_HERMES = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)


class FunctionDefinition(BaseModel):
    model_config = _STRICT
    name: str = Field(pattern=r"^[a-zA-Z0-9_-]{1,64}$")
    description: str | None = None
    parameters: dict[str, Any] | None = Field(None, description="A JSON schema of the arguments (an object).")
    strict: bool | None = None


class ToolDefinition(BaseModel):
    model_config = _STRICT
    type: Literal["function"]
    function: FunctionDefinition


class FunctionName(BaseModel):
    model_config = _STRICT
    name: str


class NamedToolChoice(BaseModel):
    model_config = _STRICT
    type: Literal["function"]
    function: FunctionName


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice


class FunctionCall(BaseModel):
    model_config = _STRICT
    name: str
    arguments: str


class ToolCall(BaseModel):
    model_config = _STRICT
    id: str
    type: Literal["function"]
    function: FunctionCall


def mode(tools: list[ToolDefinition] | None, choice: ToolChoice | None) -> str:
    """``none``, ``auto``, ``required`` or ``named`` (no tools: ``none``)."""
    if not tools:
        return "none"
    if isinstance(choice, NamedToolChoice):
        return "named"
    return choice or "auto"


def check(tools: list[ToolDefinition] | None, choice: ToolChoice | None) -> None:
    """A 400 naming the field for what no engine could follow: a choice without tools, an unknown name, a
    duplicate name, a schema the structured-output backend cannot compile."""
    if not tools:
        if choice not in (None, "none"):
            raise ToolDeclarationError("tool_choice is only allowed when tools are specified", "tool_choice")
        return
    names = [t.function.name for t in tools]
    if len(set(names)) != len(names):
        raise ToolDeclarationError("tools must have distinct function names", "tools")
    if isinstance(choice, NamedToolChoice) and choice.function.name not in names:
        raise ToolDeclarationError(f"tool_choice names {choice.function.name!r}, which is not in tools", "tool_choice")
    import xgrammar

    for i, tool in enumerate(tools):
        try:
            xgrammar.Grammar.from_json_schema(json.dumps(_parameters(tool)))
        except Exception as exc:  # xgrammar raises RuntimeError with the converter's reason
            reason = str(exc).strip().splitlines()[-1][:300]
            raise ToolDeclarationError(
                f"tools[{i}].function.parameters is not a usable JSON schema: {reason}",
                param=f"tools.{i}.function.parameters",
            ) from None


def schema(
    tools: list[ToolDefinition] | None, choice: ToolChoice | None, parallel: bool | None
) -> dict[str, Any] | None:
    """The JSON schema the reply is held to (None: free text). The ``required`` schema is vLLM's
    (``vllm.tool_parsers.utils._get_json_schema_from_tools``): an array of ``{"name", "parameters"}`` objects,
    one ``anyOf`` branch per tool, at least one item (at most one when ``parallel_tool_calls`` is false)."""
    kind = mode(tools, choice)
    assert tools is not None or kind == "none"
    if kind == "named":
        assert isinstance(choice, NamedToolChoice) and tools is not None
        return _parameters(next(t for t in tools if t.function.name == choice.function.name))
    if kind != "required":
        return None
    assert tools is not None
    branches = [
        {
            "properties": {"name": {"type": "string", "enum": [t.function.name]}, "parameters": _parameters(t)},
            "required": ["name", "parameters"],
        }
        for t in tools
    ]
    out: dict[str, Any] = {"type": "array", "minItems": 1, "items": {"type": "object", "anyOf": branches}}
    if parallel is False:
        out["maxItems"] = 1
    return out


def _parameters(tool: ToolDefinition) -> dict[str, Any]:
    return tool.function.parameters or {"type": "object", "properties": {}}


def new_call_id() -> str:
    return "call_" + secrets.token_hex(12)


def read_calls(text: str, tools: list[ToolDefinition], choice: ToolChoice | None) -> tuple[str | None, list[ToolCall]]:
    """(content, calls) of a generated reply; no calls when the text holds none (or does not parse: a reply cut
    by ``max_tokens``)."""
    kind = mode(tools, choice)
    try:
        if kind == "named":
            assert isinstance(choice, NamedToolChoice)
            json.loads(text)
            return None, [_call(choice.function.name, text)]
        if kind == "required":
            items = json.loads(text)
            return None, [_call(item["name"], json.dumps(item["parameters"], ensure_ascii=False)) for item in items]
    except (ValueError, TypeError, KeyError):
        return text, []
    if kind != "auto":
        return text, []
    names = {t.function.name for t in tools}
    calls = []
    for block in _HERMES.findall(text):
        try:
            item = json.loads(block)
            if item["name"] in names and isinstance(item.get("arguments", {}), dict):
                calls.append(_call(item["name"], json.dumps(item.get("arguments", {}), ensure_ascii=False)))
        except (ValueError, TypeError, KeyError):
            continue
    if not calls:
        return text, []
    before = text[: text.index("<tool_call>")].strip()
    return before or None, calls


def _call(name: str, arguments: str) -> ToolCall:
    return ToolCall(id=new_call_id(), type="function", function=FunctionCall(name=name, arguments=arguments))


def render_calls(calls: list[ToolCall]) -> str:
    """An assistant turn's calls as the text a template without a tool format shows the model (hermes style)."""
    blocks = []
    for call in calls:
        try:
            arguments: Any = json.loads(call.function.arguments)
        except ValueError:
            arguments = call.function.arguments
        body = json.dumps({"name": call.function.name, "arguments": arguments}, ensure_ascii=False)
        blocks.append(f"<tool_call>{body}</tool_call>")
    return "\n".join(blocks)
