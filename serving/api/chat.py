"""The answers of ``POST /v1/chat/completions``, on top of the gateway's pipeline (``serving.pipeline.gateway``): the
non-streaming body, the SSE stream of chat chunks, and the conversation turns saved before either ends.

    call = await gw.prepare(key, req, request_id)
    body = await chat.complete(gw, call)          # or: StreamingResponse(chat.sse(gw, call))

A blocked exchange (the pre-filter refused the prompt, or the post-filter stopped the reply) is saved marked
``filtered`` (``pre:<rule>`` / ``post:<rule>``): shown in the conversation's history, kept out of every later
turn's context (``Gateway.history`` leaves it out).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import anyio

from serving.pipeline.call import Call
from serving.pipeline.gateway import Gateway
from serving.wire import protocol


async def complete(gw: Gateway, call: Call) -> dict[str, Any]:
    """The non-streaming response (the same pipeline as a stream, collected)."""
    async for _ in gw.run(call):
        pass
    await save_turns(gw, call)
    return protocol.completion(
        call.request_id,
        call.request.model,
        "".join(call.text),
        call.finish_reason,
        len(call.prompt_ids),
        call.completion_tokens,
        call.conversation_id,
        call.created,
    )


def sse(gw: Gateway, call: Call) -> AsyncIterator[bytes]:
    """Server-Sent Events in the OpenAI chat chunk format, then ``data: [DONE]``."""
    model, rid, created, conv = call.request.model, call.request_id, call.created, call.conversation_id

    async def closing() -> list[dict[str, Any]]:
        await save_turns(gw, call)
        events = [protocol.chunk(rid, model, created, {}, call.finish_reason, conv)]
        opts = call.request.stream_options
        if opts is not None and opts.include_usage:
            events.append(protocol.usage_chunk(rid, model, created, len(call.prompt_ids), call.completion_tokens))
        return events

    return gw.events(
        call,
        [protocol.chunk(rid, model, created, {"role": "assistant", "content": ""}, None, conv)],
        lambda piece: protocol.chunk(rid, model, created, {"content": piece}, None, conv),
        closing,
    )


async def save_turns(gw: Gateway, call: Call) -> None:
    """The new turns and the reply join the conversation before the response ends, so a client's next turn
    always sees them (only the log, usage and metrics are written after)."""
    if call.key is None or not call.conversation_id or call.status not in ("ok", "content_filter"):
        return
    key_id, conv_id, ref = call.key.id, call.conversation_id, call.served.ref
    mark = {}
    if call.pre_filter or call.post_filter:
        mark["filtered"] = f"pre:{call.pre_filter}" if call.pre_filter else f"post:{call.post_filter}"
    turns = [{**m, **mark} for m in call.new_messages]
    reply = {"role": "assistant", "content": "".join(call.text), **mark}

    def save() -> None:
        gw.store.append_messages(key_id, conv_id, turns, None)
        gw.store.append_messages(key_id, conv_id, [reply], ref)

    await anyio.to_thread.run_sync(save)
