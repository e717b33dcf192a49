"""The OpenAPI document of the gateway: what each route takes and every answer it can give, so fuzzers
(schemathesis runs in the test suite against a live gateway) and client generators can use it.

The routes read their JSON bodies themselves (``serving.api.body``: size, media type, depth and surrogates come
before any parsing), so FastAPI cannot infer the request bodies: ``body(Model)`` declares one from the same
pydantic model the route validates with. The answers are the models of ``serving.wire.responses``, from which
the routes build their JSON (one description of the format; the schemathesis test checks the live answers against
this document). ``install(app)`` adds the request models to the components and the bearer-key security scheme.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel

from serving.wire.embeddings import EmbeddingList
from serving.wire.responses import (
    ChatCompletion,
    Completion,
    ConversationDeleted,
    ConversationList,
    ConversationOut,
    ErrorResponse,
    FeedbackOut,
    Health,
    ModelList,
    Readiness,
    UsageList,
)

__all__ = [
    "ChatCompletion",
    "Completion",
    "ConversationDeleted",
    "ConversationList",
    "ConversationOut",
    "EmbeddingList",
    "FeedbackOut",
    "Health",
    "ModelList",
    "Readiness",
    "UsageList",
]

_REF = "#/components/schemas/{model}"


NO_KEY: dict[str, Any] = {"security": []}  # health routes: open
OPTIONAL_KEY: dict[str, Any] = {"security": [{}, {"apiKey": []}]}  # /metrics: a token only when one is configured


def _error(description: str) -> dict[str, Any]:
    return {"model": ErrorResponse, "description": description}


CLIENT_ERRORS: dict[int | str, dict[str, Any]] = {
    400: _error("Invalid request: malformed JSON, an unsupported or out-of-range value, a missing user turn"),
    401: _error("Missing, unknown or revoked API key"),
    404: _error("Unknown model or conversation"),
    422: _error("The body breaks the schema: the field is named in param"),
    500: _error("An unexpected failure, with the request id (never caused by client input)"),
}
BODY_ERRORS: dict[int | str, dict[str, Any]] = {
    **CLIENT_ERRORS,
    413: _error("The body is larger than serving.limits.max_body_bytes"),
    415: _error("The body is not declared application/json"),
    429: _error("Over the key's request or token limit (Retry-After says when to retry)"),
    503: _error("No healthy engine can answer (Retry-After says when to retry)"),
}
ROUTE_ERRORS: dict[int | str, dict[str, Any]] = {**CLIENT_ERRORS, 503: BODY_ERRORS[503]}
FEEDBACK_ERRORS: dict[int | str, dict[str, Any]] = {
    **BODY_ERRORS,
    400: _error("Invalid request: malformed JSON, or a response that ended without an answer to rate"),
    404: _error("No such response of this API key (another key's response looks the same)"),
    422: _error("The body breaks the schema, a rating other than 1 or -1, a text over the length limit"),
}


def answers(model: type[BaseModel], errors: dict[int | str, dict[str, Any]]) -> dict[int | str, dict[str, Any]]:
    """A route's ``responses``: its 200 body (the model the route builds its JSON from) and its error answers."""
    return {200: {"model": model, "description": "OK"}, **errors}


def body(model: type[BaseModel], *, streams: bool) -> dict[str, Any]:
    """``openapi_extra`` of a route that reads ``model`` as its JSON body (and may answer with SSE)."""
    extra: dict[str, Any] = {
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": {"$ref": _REF.format(model=model.__name__)}}},
        }
    }
    if streams:
        sse = {"schema": {"type": "string", "description": "Server-Sent Events ending with data: [DONE]"}}
        extra["responses"] = {"200": {"content": {"text/event-stream": sse}}}
    return extra


def install(app: FastAPI, request_models: list[type[BaseModel]]) -> None:
    """Generate the document once, with the request models in its components and the bearer-key scheme."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        doc = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
        schemas = doc.setdefault("components", {}).setdefault("schemas", {})
        for model in request_models:
            schema = model.model_json_schema(ref_template=_REF)
            schemas.update(schema.pop("$defs", {}))
            schemas[model.__name__] = schema
        doc["components"]["securitySchemes"] = {"apiKey": {"type": "http", "scheme": "bearer"}}
        doc["security"] = [{"apiKey": []}]
        app.openapi_schema = doc
        return doc

    app.openapi = openapi  # type: ignore[method-assign]
