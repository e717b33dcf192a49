"""OpenAI's routes: ``POST /v1/chat/completions`` (``serving.api.chat``), ``POST /v1/completions``
(``serving.api.completions``), streamed as server-sent events or answered whole, ``POST /v1/embeddings``
(``serving.pipeline.embeddings``) and ``GET /v1/models``."""

from __future__ import annotations

from functools import partial
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from core.errors import NotFoundError
from serving.api import chat, completions
from serving.api.admission import admit, answer, gateway, runtime, sse
from serving.api.body import read_json
from serving.api.http import REQUEST_ID
from serving.engines.router import ServedModel
from serving.pipeline import embeddings
from serving.pipeline.gateway import Gateway
from serving.wire import openapi, responses
from serving.wire.embeddings import EmbeddingRequest
from serving.wire.protocol import ChatCompletionRequest

router = APIRouter()


@router.post(
    "/v1/chat/completions",
    tags=["openai"],
    response_model=None,
    responses=openapi.answers(openapi.ChatCompletion, openapi.BODY_ERRORS),
    openapi_extra=openapi.body(ChatCompletionRequest, streams=True),
)
async def chat_completions(request: Request) -> Response:
    gw = gateway(request)
    req, call = await admit(request, gw, gw.parse, gw.prepare)
    if req.stream:
        return sse(chat.sse(gw, call), call.headers())
    return await answer(request, gw, [call], chat.complete(gw, call), call.headers())


@router.post(
    "/v1/completions",
    tags=["openai"],
    response_model=None,
    responses=openapi.answers(openapi.Completion, openapi.BODY_ERRORS),
    openapi_extra=openapi.body(completions.CompletionRequest, streams=True),
)
async def text_completions(request: Request) -> Response:
    request.state.request_id = "cmpl-" + request.state.request_id.split("-", 1)[1]
    gw = gateway(request)
    req, calls = await admit(request, gw, partial(completions.parse, gw), partial(completions.prepare, gw))
    headers = {**calls[0].headers(), REQUEST_ID: request.state.request_id}
    if req.stream:
        return sse(completions.sse(gw, req, calls[0]), headers)
    return await answer(request, gw, calls, completions.complete(gw, req, calls), headers)


@router.post(
    "/v1/embeddings",
    tags=["openai"],
    response_model=None,
    responses=openapi.answers(openapi.EmbeddingList, openapi.BODY_ERRORS),
    openapi_extra=openapi.body(EmbeddingRequest, streams=False),
)
async def create_embeddings(request: Request) -> dict[str, Any]:
    gw = gateway(request)
    key = await gw.authenticate(request.headers.get("authorization"))
    gw.check_rate(key)
    req, texts = embeddings.parse(gw, await read_json(request, gw.cfg.limits))
    return await embeddings.embed(gw, key, req, texts)


@router.get(
    "/v1/models",
    tags=["openai"],
    response_model=None,
    responses=openapi.answers(openapi.ModelList, openapi.ROUTE_ERRORS),
)
async def models(request: Request) -> dict[str, Any]:
    gw = gateway(request)
    await gw.authenticate(request.headers.get("authorization"))
    table = gw.router
    created = int(runtime(request).started_at)
    price = gw.cfg.cost
    loaded = {s.version: s for s in table.models()}

    def card(name: str, served: ServedModel | None, version: str | None = None) -> responses.ModelCard:
        return responses.ModelCard(
            id=name,
            object="model",
            created=created,
            owned_by="chat-lifecycle",
            x_model_version=version,
            x_context_window=(served.engine.max_model_len or None) if served is not None else None,
            x_hardware=price.hardware,
            x_price_usd_per_replica_hour=price.price_usd_per_replica_hour,
        )

    data = [card(table.routing.served_name, _primary(gw), _primary_header(gw))]
    for alias, version in sorted(table.aliases.items()):
        data.append(card(f"{table.model_name}@{alias}", loaded.get(version), f"{table.model_name}/{version}"))
    data += [card(served.ref, served) for served in sorted(loaded.values(), key=lambda s: int(s.version))]
    return responses.dump(responses.ModelList(object="list", data=data))


def _primary(gw: Gateway) -> ServedModel | None:
    try:
        return gw.router.route(gw.router.routing.served_name).model
    except NotFoundError:
        return None


def _primary_header(gw: Gateway) -> str | None:
    served = _primary(gw)
    return served.header() if served is not None else None
