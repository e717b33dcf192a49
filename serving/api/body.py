"""Reading a JSON request body as a hostile client may send it: the checks that come before any other work.

    raw = await read_json(request, cfg.limits)     # a dict, or an APIError (4xx) naming what is wrong

In order, each refusing before the next costs anything: the media type (415 unless ``application/json``), the
declared length (413 over ``limits.max_body_bytes``, before a byte is read), the bytes as they arrive (413 as
soon as they pass the limit: a chunked body has no declared length), UTF-8 (400), JSON syntax (400; ``NaN`` and
``Infinity`` are not JSON and are refused too), nesting depth (400 past ``limits.max_json_depth``; Python's parser
would otherwise recurse until a ``RecursionError``), and lone UTF-16 surrogates (``"\\ud800"`` is valid JSON
but no valid text: it would fail later, in the tokenizer or the database, as a 500). Parsing a large body runs in a
worker thread, so a 1 MB body never holds the event loop (and ``/healthz``) for the time it takes.
"""

from __future__ import annotations

import json
import re
from typing import Any

import anyio
from starlette.requests import Request

from serving.config import RequestLimits
from serving.wire.errors import bad_request, too_large, unsupported_media_type

_SURROGATE = re.compile("[\ud800-\udfff]")
_IN_THREAD_BYTES = 64 * 1024  # smaller bodies parse in well under a millisecond: not worth a thread hop


async def read_json(request: Request, limits: RequestLimits) -> dict[str, Any]:
    media_type = (request.headers.get("content-type") or "").split(";")[0].strip().lower()
    if media_type != "application/json":
        shown = media_type or "none"
        raise unsupported_media_type(f"The request body must be JSON (Content-Type: application/json), got {shown}")
    limit = limits.max_body_bytes
    declared = request.headers.get("content-length")
    if declared is not None:
        if not declared.isdigit():
            raise bad_request(f"Content-Length must be a number of bytes, got {declared!r}", code="invalid_request")
        if int(declared) > limit:
            raise too_large(f"The request body is {declared} bytes; this endpoint accepts at most {limit}")
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise too_large(f"The request body is over {limit} bytes, the most this endpoint accepts")
    data = bytes(body)
    if len(data) > _IN_THREAD_BYTES:
        return await anyio.to_thread.run_sync(parse_json, data, limits.max_json_depth)
    return parse_json(data, limits.max_json_depth)


def parse_json(body: bytes, max_depth: int) -> dict[str, Any]:
    """A JSON object from ``body``, or a 400 naming why not (see the module docstring)."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise bad_request(f"The request body is not UTF-8: {exc}", code="invalid_json") from None
    try:
        value = json.loads(text, parse_constant=_no_constants)
    except RecursionError:
        raise _too_deep(max_depth) from None
    except ValueError as exc:  # JSONDecodeError is a ValueError, as is a NaN or Infinity
        raise bad_request(f"The request body is not valid JSON: {exc}", code="invalid_json") from None
    if not isinstance(value, dict):
        raise bad_request("The request body must be a JSON object", code="invalid_json")
    _check(value, max_depth)
    return value


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _too_deep(max_depth: int) -> Exception:
    return bad_request(f"The request body is nested more than {max_depth} levels deep", code="invalid_json")


def _check(value: Any, max_depth: int) -> None:
    """Depth and lone surrogates, iteratively (no recursion for an attacker to exhaust)."""
    stack: list[tuple[Any, int, str]] = [(value, 1, "")]
    while stack:
        item, depth, path = stack.pop()
        if isinstance(item, str):
            if _SURROGATE.search(item):
                where = path or "the body"
                raise bad_request(
                    f"{where} contains a lone UTF-16 surrogate (not valid Unicode text)",
                    code="invalid_json",
                    param=path or None,
                )
            continue
        if not isinstance(item, dict | list):
            continue
        if depth > max_depth:
            raise _too_deep(max_depth)
        if isinstance(item, dict):
            for key, child in item.items():
                stack.append((key, depth, path))
                stack.append((child, depth + 1, f"{path}.{key}" if path else key))
        else:
            stack.extend((child, depth + 1, f"{path}.{i}") for i, child in enumerate(item))
