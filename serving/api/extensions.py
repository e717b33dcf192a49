"""Our extensions of the OpenAI API (tagged ``extension`` in the OpenAPI document), per tenant: the key's
conversations (list, read, delete), its daily usage, and ``POST /v1/feedback`` (``serving.api.feedback``)."""

from __future__ import annotations

from datetime import date
from typing import Any

import anyio
from fastapi import APIRouter, Request

from core.errors import NotFoundError
from serving.api import feedback
from serving.api.admission import gateway, tenant
from serving.api.body import read_json
from serving.wire import openapi, responses
from serving.wire.errors import bad_request, not_found

router = APIRouter()


@router.get(
    "/v1/conversations",
    tags=["extension"],
    response_model=None,
    responses=openapi.answers(openapi.ConversationList, openapi.ROUTE_ERRORS),
)
async def list_conversations(request: Request, limit: int = 20, before: str | None = None) -> dict[str, Any]:
    gw = gateway(request)
    key = await tenant(gw, request)
    if not 1 <= limit <= 100:
        raise bad_request("limit must be between 1 and 100", param="limit")
    try:
        convs = await anyio.to_thread.run_sync(lambda: gw.store.list_conversations(key.id, limit=limit, before=before))
    except NotFoundError:  # a cursor that is not one of this key's conversations (another key's looks the same)
        raise bad_request(
            f"before must be the id of one of your conversations (the last of the previous page), got {before!r}",
            code="invalid_cursor",
            param="before",
        ) from None
    return responses.dump(responses.ConversationList(object="list", data=[_conversation(c) for c in convs]))


@router.get(
    "/v1/conversations/{conversation_id}",
    tags=["extension"],
    response_model=None,
    responses=openapi.answers(openapi.ConversationOut, openapi.ROUTE_ERRORS),
)
async def get_conversation(request: Request, conversation_id: str) -> dict[str, Any]:
    gw = gateway(request)
    key = await tenant(gw, request)
    try:
        conv = await anyio.to_thread.run_sync(gw.store.get_conversation, key.id, conversation_id)
    except NotFoundError as exc:
        raise not_found(str(exc), code="conversation_not_found") from None
    return responses.dump(_conversation(conv, with_messages=True))


@router.delete(
    "/v1/conversations/{conversation_id}",
    tags=["extension"],
    response_model=None,
    responses=openapi.answers(openapi.ConversationDeleted, openapi.ROUTE_ERRORS),
)
async def delete_conversation(request: Request, conversation_id: str) -> dict[str, Any]:
    gw = gateway(request)
    key = await tenant(gw, request)
    try:
        await anyio.to_thread.run_sync(gw.store.delete_conversation, key.id, conversation_id)
    except NotFoundError as exc:
        raise not_found(str(exc), code="conversation_not_found") from None
    deleted = responses.ConversationDeleted(id=conversation_id, object="conversation.deleted", deleted=True)
    return responses.dump(deleted)


@router.get(
    "/v1/usage",
    tags=["extension"],
    response_model=None,
    responses=openapi.answers(openapi.UsageList, openapi.ROUTE_ERRORS),
)
async def usage(request: Request, start: str | None = None, end: str | None = None) -> dict[str, Any]:
    gw = gateway(request)
    key = await tenant(gw, request)
    first, last = _day(start, "start"), _day(end, "end")
    rows = await anyio.to_thread.run_sync(lambda: gw.store.usage(key.id, first, last))
    data = [
        responses.UsageDay(
            date=r.day.isoformat(),
            model=r.model,
            requests=r.requests,
            prompt_tokens=r.prompt_tokens,
            completion_tokens=r.completion_tokens,
            total_tokens=r.prompt_tokens + r.completion_tokens,
            cost_usd=r.cost_usd,
        )
        for r in rows
    ]
    return responses.dump(responses.UsageList(object="list", key_id=key.id, data=data))


@router.post(
    "/v1/feedback",
    tags=["extension"],
    response_model=None,
    responses=openapi.answers(openapi.FeedbackOut, openapi.FEEDBACK_ERRORS),
    openapi_extra=openapi.body(feedback.FeedbackRequest, streams=False),
)
async def rate(request: Request) -> dict[str, Any]:
    gw = gateway(request)
    key = await tenant(gw, request)
    gw.check_rate(key)
    req = feedback.parse(await read_json(request, gw.cfg.limits), gw.cfg.limits)
    return await feedback.submit(gw, key, req)


def _day(value: str | None, param: str) -> date | None:
    if value is None:
        return None
    try:
        return date.fromisoformat(value)
    except ValueError:
        raise bad_request(f"{param} must be a date like 2026-11-21, got {value!r}", param=param) from None


def _conversation(conv: Any, *, with_messages: bool = False) -> responses.ConversationOut:
    out = responses.ConversationOut(
        id=conv.id, object="conversation", created=int(conv.created_at.timestamp()), model=conv.model
    )
    if with_messages:
        out.messages = [
            responses.StoredMessageOut(**{k: (v.isoformat() if hasattr(v, "isoformat") else v) for k, v in m.items()})
            for m in conv.messages
        ]
    return out
