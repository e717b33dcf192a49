"""Errors at the HTTP boundary, OpenAI-shaped: ``{"error": {"message", "type", "param", "code"}}``.

    APIError                         raised anywhere below the routes; the app turns it into JSON + status
    ├── 400 invalid_request_error    malformed JSON (not UTF-8, nested too deep, a lone surrogate), an unsupported
    │                                or out-of-range parameter, no user turn, a prompt over the context budget
    ├── 401 authentication_error     missing, unknown or revoked key
    ├── 404 not_found_error          unknown model, route or conversation (another key's conversation is a 404 too)
    ├── 405 invalid_request_error    a method the route does not have (with ``Allow``)
    ├── 413 invalid_request_error    a body over ``serving.limits.max_body_bytes``
    ├── 415 invalid_request_error    a body that is not declared ``application/json``
    ├── 422 invalid_request_error    a body that is JSON but breaks the schema (field named in ``param``)
    ├── 429 rate_limit_error         over the key's request or token limit, with ``Retry-After``
    └── 503 service_unavailable      no healthy engine can answer (never for client mistakes), with ``Retry-After``

A client error is never a 500: unexpected exceptions become a 500 ``server_error`` with the request id and no
traceback (the traceback goes to the log), answered by ``serving.api.http.GatewayMiddleware`` without re-raising, so
the server keeps the client's keep-alive connection. A stream that fails after its 200 ends with this same body as
an SSE event, then ``data: [DONE]``.
"""

from __future__ import annotations

from typing import Any

from fastapi.responses import JSONResponse

from serving.wire import responses


class APIError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",  # noqa: A002 - the OpenAI field name
        code: str | None = None,
        param: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.code = code
        self.param = param
        self.headers = headers or {}

    @property
    def label(self) -> str:
        """The ``code`` label of ``lifecycle_errors_total`` (a fixed vocabulary: codes and types of this module)."""
        return self.code or self.type

    def body(self) -> dict[str, Any]:
        return error_body(self.message, self.type, self.code, self.param)

    def response(self, extra_headers: dict[str, str] | None = None) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers={**self.headers, **(extra_headers or {})})


def error_body(message: str, type: str, code: str | None = None, param: str | None = None) -> dict[str, Any]:  # noqa: A002
    error = responses.ErrorObject(message=message, type=type, param=param, code=code)
    return responses.dump(responses.ErrorResponse(error=error))


def bad_request(message: str, *, code: str | None = None, param: str | None = None) -> APIError:
    return APIError(400, message, code=code, param=param)


def invalid(message: str, *, param: str | None) -> APIError:
    """A value the schema allows in type but not in range (422 like a schema error, naming the field)."""
    return APIError(422, message, code="invalid_value", param=param)


def not_found(message: str, *, code: str = "not_found") -> APIError:
    return APIError(404, message, type="not_found_error", code=code)


def unauthorized(message: str) -> APIError:
    return APIError(401, message, type="authentication_error", code="invalid_api_key")


def too_large(message: str) -> APIError:
    return APIError(413, message, code="body_too_large")


def unsupported_media_type(message: str) -> APIError:
    return APIError(415, message, code="unsupported_media_type")


def rate_limited(message: str, retry_after_s: int, *, code: str = "rate_limit_exceeded") -> APIError:
    return APIError(
        429, message, type="rate_limit_error", code=code, headers={"Retry-After": str(max(1, retry_after_s))}
    )


def unavailable(message: str, retry_after_s: int) -> APIError:
    return APIError(
        503,
        message,
        type="service_unavailable",
        code="engine_unavailable",
        headers={"Retry-After": str(max(1, retry_after_s))},
    )


def server_error(request_id: str) -> APIError:
    return APIError(
        500,
        f"The server had an error processing request {request_id}; it has been logged.",
        type="server_error",
        code="internal_error",
    )
