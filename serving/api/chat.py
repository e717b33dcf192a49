"""The answers of ``POST /v1/chat/completions``, on top of the gateway's pipeline (``serving.pipeline.gateway``): the
non-streaming body, the SSE stream of chat chunks, and the conversation turns saved before either ends.

    call = await gw.prepare(key, req, request_id)
    body = await chat.complete(gw, call)          # or: StreamingResponse(chat.sse(gw, call))

With ``tools`` (``serving.wire.tools``), a reply that holds tool calls is answered as ``tool_calls`` with
``finish_reason: tool_calls``; a stream holds the text back and sends the calls in one delta once they are
complete (a call's arguments must be whole JSON to be read; the post-filter has judged them like any text), then
the finish. The stored reply is the calls' hermes text (what a template without a tool format shows the model).

A blocked exchange (the pre-filter refused the prompt, or the post-filter stopped the reply) is saved marked
``filtered`` (``pre:<rule>`` / ``post:<rule>``): shown in the conversation's history, kept out of every later
turn's context (``Gateway.history`` leaves it out).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import anyio

from serving.pipeline.call import Call
from serving.pipeline.gateway import Gateway
from serving.wire import protocol, tools
from serving.wire.tools import ToolCall


@dataclass(frozen=True)
class Reply:
    """What a finished chat request answers: its text (None: only calls), its tool calls, its finish reason."""

    content: str | None
    calls: list[ToolCall]
    finish_reason: str | None


def reply(call: Call) -> Reply:
    """The reply of a finished call: tool calls read from its text when the request has tools and the model
    finished on its own (a cut, filtered or aborted reply stays text)."""
    req = call.request
    text = "".join(call.text)
    if not isinstance(req, protocol.ChatCompletionRequest) or req.tool_mode() == "none" or not req.tools:
        return Reply(text, [], call.finish_reason)
    if call.status != "ok" or call.finish_reason != "stop":
        return Reply(text, [], call.finish_reason)
    content, calls = tools.read_calls(text, req.tools, req.tool_choice)
    return Reply(content, calls, "tool_calls" if calls else call.finish_reason)


async def complete(gw: Gateway, call: Call) -> dict[str, Any]:
    """The non-streaming response (the same pipeline as a stream, collected)."""
    async for _ in gw.run(call):
        pass
    out = reply(call)
    await save_turns(gw, call, out)
    return protocol.completion(
        call.request_id,
        call.request.model,
        out.content,
        out.finish_reason,
        len(call.prompt_ids),
        call.completion_tokens,
        call.conversation_id,
        call.created,
        out.calls,
    )


def sse(gw: Gateway, call: Call) -> AsyncIterator[bytes]:
    """Server-Sent Events in the OpenAI chat chunk format, then ``data: [DONE]``."""
    model, rid, created, conv = call.request.model, call.request_id, call.created, call.conversation_id
    req = call.request
    held = isinstance(req, protocol.ChatCompletionRequest) and req.tool_mode() != "none"

    def event(piece: str) -> dict[str, Any] | None:
        return None if held else protocol.chunk(rid, model, created, {"content": piece}, None, conv)

    async def closing() -> list[dict[str, Any]]:
        out = reply(call)
        await save_turns(gw, call, out)
        events = []
        if held and out.content:
            events.append(protocol.chunk(rid, model, created, {"content": out.content}, None, conv))
        if out.calls:
            deltas = [{"index": i, **c.model_dump()} for i, c in enumerate(out.calls)]
            events.append(protocol.chunk(rid, model, created, {"tool_calls": deltas}, None, conv))
        events.append(protocol.chunk(rid, model, created, {}, out.finish_reason, conv))
        opts = call.request.stream_options
        if opts is not None and opts.include_usage:
            events.append(protocol.usage_chunk(rid, model, created, len(call.prompt_ids), call.completion_tokens))
        return events

    return gw.events(
        call, [protocol.chunk(rid, model, created, {"role": "assistant", "content": ""}, None, conv)], event, closing
    )


async def save_turns(gw: Gateway, call: Call, out: Reply) -> None:
    """The new turns and the reply join the conversation before the response ends, so a client's next turn
    always sees them (only the log, usage and metrics are written after). The reply is remembered as the gateway's
    own whether or not the request names a conversation: a client that sends it back as an assistant turn is not
    judged for it (``SafetyFilters.remember_reply``)."""
    if call.status not in ("ok", "content_filter"):
        return
    text = tools.render_calls(out.calls) if out.calls else "".join(call.text)
    if out.calls and out.content:
        text = out.content + "\n" + text
    call.reply_digest = gw.filters.remember_reply(text)
    if call.key is None or not call.conversation_id:
        return
    key_id, conv_id, ref = call.key.id, call.conversation_id, call.served.ref
    mark = {}
    if call.pre_filter or call.post_filter:
        mark["filtered"] = f"pre:{call.pre_filter}" if call.pre_filter else f"post:{call.post_filter}"
    turns = [{**m, **mark} for m in call.new_messages]
    stored = {"role": "assistant", "content": text, **mark}

    def save() -> None:
        gw.store.append_messages(key_id, conv_id, turns, None)
        gw.store.append_messages(key_id, conv_id, [stored], ref)

    await anyio.to_thread.run_sync(save)
