"""Errors at the HTTP boundary, OpenAI-shaped: ``{"error": {"message", "type", "param", "code"}}``.

    APIError                         raised anywhere below the routes; the app turns it into JSON + status
    ├── 400 invalid_request_error    malformed JSON, unsupported parameter, prompt over the context budget
    ├── 401 authentication_error     missing, unknown or revoked key
    ├── 404 not_found_error          unknown model or conversation (another key's conversation is a 404 too)
    ├── 422 invalid_request_error    a body that is JSON but breaks the schema (field named in ``param``)
    ├── 429 rate_limit_error         over the key's request or token limit, with ``Retry-After``
    └── 503 service_unavailable      no healthy engine can answer (never for client mistakes)

A client error is never a 500: unexpected exceptions become a 500 ``server_error`` with the request id and no
traceback (the traceback goes to the log).
"""

from __future__ import annotations

from typing import Any

from fastapi.responses import JSONResponse


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

    def body(self) -> dict[str, Any]:
        return error_body(self.message, self.type, self.code, self.param)

    def response(self, extra_headers: dict[str, str] | None = None) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers={**self.headers, **(extra_headers or {})})


def error_body(message: str, type: str, code: str | None = None, param: str | None = None) -> dict[str, Any]:  # noqa: A002
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def bad_request(message: str, *, code: str | None = None, param: str | None = None) -> APIError:
    return APIError(400, message, code=code, param=param)


def not_found(message: str, *, code: str = "not_found") -> APIError:
    return APIError(404, message, type="not_found_error", code=code)


def unauthorized(message: str) -> APIError:
    return APIError(401, message, type="authentication_error", code="invalid_api_key")


def rate_limited(message: str, retry_after_s: int, *, code: str = "rate_limit_exceeded") -> APIError:
    return APIError(
        429, message, type="rate_limit_error", code=code, headers={"Retry-After": str(max(1, retry_after_s))}
    )


def unavailable(message: str) -> APIError:
    return APIError(503, message, type="service_unavailable", code="engine_unavailable")
