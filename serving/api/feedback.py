"""``POST /v1/feedback`` (our extension): a user's thumbs up or down on one answer, with an optional better answer.

    {"response_id": "chatcmpl-...", "rating": -1, "better_answer": "...", "comment": "...", "reason": "unsafe"}

``response_id`` is the ``id`` of a chat completion (the request id: also the ``x-request-id`` header). The rating
is stored on that answer's request-log row (``serving.state.ratings``), counted per model version in
``lifecycle_feedback_total``, read by the canary analysis (``monitoring.canary``: thumbs-down rate) and, for keys
that opted in to training, curated into preference pairs (``training.data.curate_feedback``).

Rules, each a 4xx with an OpenAI-shaped error: the key must be the one that asked for the answer (another key's
response is a 404 like an unknown id); ``rating`` is the integer 1 or -1 (422); a better answer and a ``reason``
(unsafe, wrong_refusal, incorrect, other) go with a thumbs down only (422); texts longer than
``serving.limits.max_feedback_chars`` are refused (422), blank ones count as absent; a request that ended without
an answer (an error, refused before generation) cannot be rated (400). Rating the same answer again replaces the
earlier rating. A rating counts against the key's requests-per-minute limit like any request.

A client may rate as soon as its response ended: the request-log row is written just after (``Gateway.finish``),
so the route first waits for that write (``Gateway.recorded``) instead of answering 404 for a row not yet there.
"""

from __future__ import annotations

from typing import Any, Literal

import anyio
from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr

from core.errors import DataError, NotFoundError
from serving.config import RequestLimits
from serving.pipeline.gateway import Gateway
from serving.state.store import ApiKey
from serving.wire import responses
from serving.wire.errors import bad_request, invalid, not_found
from serving.wire.protocol import validate


class FeedbackRequest(BaseModel):
    """The body of ``POST /v1/feedback``."""

    model_config = ConfigDict(extra="forbid")
    response_id: StrictStr = Field(
        min_length=1, max_length=100, description="The id of the chat completion rated (its x-request-id)."
    )
    rating: StrictInt = Field(description="1: thumbs up, -1: thumbs down.", json_schema_extra={"enum": [1, -1]})
    better_answer: StrictStr | None = Field(
        None, description="With a thumbs down: the answer that should have been given (curated as the preferred one)."
    )
    comment: StrictStr | None = Field(None, description="Free text about the answer (kept with the rating).")
    reason: Literal["unsafe", "wrong_refusal", "incorrect", "other"] | None = Field(
        None,
        description="With a thumbs down, why: 'unsafe' (the answer helped with something harmful: its prompt is "
        "proposed to the safety classifier's next training data), 'wrong_refusal' (a fair request refused), "
        "'incorrect' or 'other'.",
    )


def parse(raw: dict[str, Any], limits: RequestLimits) -> FeedbackRequest:
    """The validated body: 422 naming the field for a wrong type, value or length; blank texts become None."""
    req = validate(FeedbackRequest, raw)
    if req.rating not in (1, -1):
        raise invalid(f"rating must be 1 (thumbs up) or -1 (thumbs down), got {req.rating}", param="rating")
    texts: dict[str, str | None] = {}
    for name in ("better_answer", "comment"):
        value: str | None = getattr(req, name)
        if value is not None and len(value) > limits.max_feedback_chars:
            raise invalid(
                f"{name} has {len(value)} characters, more than serving.limits.max_feedback_chars "
                f"({limits.max_feedback_chars})",
                param=name,
            )
        texts[name] = value if value and value.strip() else None
    if texts["better_answer"] is not None and req.rating != -1:
        raise invalid("better_answer goes with a thumbs down (rating -1)", param="better_answer")
    if req.reason is not None and req.rating != -1:
        raise invalid("reason goes with a thumbs down (rating -1)", param="reason")
    return req.model_copy(update=texts)


async def submit(gw: Gateway, key: ApiKey, req: FeedbackRequest) -> dict[str, Any]:
    """Store the rating on the key's answer and count it; the JSON answer of the route."""
    await gw.recorded(req.response_id)
    try:
        fb = await anyio.to_thread.run_sync(
            lambda: gw.store.record_feedback(
                key.id, req.response_id, req.rating, req.better_answer, req.comment, req.reason
            )
        )
    except NotFoundError:
        raise not_found(f"No response {req.response_id!r} of this API key", code="response_not_found") from None
    except DataError as exc:
        raise bad_request(str(exc), code="response_not_rateable", param="response_id") from None
    gw.metrics.feedback.labels(fb.model_version or "none", "up" if fb.rating > 0 else "down").inc()
    body = responses.FeedbackOut(
        object="feedback",
        response_id=fb.response_id,
        rating=fb.rating,
        better_answer=fb.better_answer is not None,
        reason=fb.reason,
        model_version=fb.model_version,
        created=int(fb.at.timestamp()),
    )
    return responses.dump(body)
