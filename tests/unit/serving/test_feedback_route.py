"""``POST /v1/feedback`` on a gateway on fakes: a rating lands on the answer's request-log row (right after the
response, without waiting for the background write), redacted, counted per model version in /metrics, replaced by
a later rating; every bad input is an OpenAI-shaped 4xx naming the field (unknown id, another key's answer, a bad
rating, a too-long text, a better answer with a thumbs up, a request that ended without an answer)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import httpx
import pytest
from unit.serving.harness import Harness, MakeHarness, sse_events

from serving.state.store import RequestLogEntry

pytestmark = pytest.mark.anyio


async def rate(h: Harness, body: dict[str, Any], secret: str | None = None) -> httpx.Response:
    return await h.request("POST", "/v1/feedback", json=body, secret=secret)


def error(r: httpx.Response, status: int, code: str, param: str | None) -> str:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert (err["code"], err["param"]) == (code, param)
    return str(err["message"])


def counted(h: Harness, version: str, rating: str) -> float | None:
    return h.runtime.gateway.metrics.registry.get_sample_value(
        "lifecycle_feedback_total", {"model_version": version, "rating": rating}
    )


async def test_a_rating_lands_on_the_request_log_row_and_is_counted(make_harness: MakeHarness) -> None:
    h = make_harness()
    answer = await h.chat("what is 2 + 2?")
    rid = answer.json()["id"]
    assert rid == answer.headers["x-request-id"]
    # no drain: the route itself waits for the row the gateway writes after the response
    r = await rate(h, {"response_id": rid, "rating": -1, "better_answer": "4. Mail me at jo@example.com"})
    assert r.status_code == 200, r.text
    body = r.json()
    assert (body["object"], body["response_id"], body["rating"], body["better_answer"]) == ("feedback", rid, -1, True)
    assert body["model_version"] == "chat/2"
    [row] = await h.log()
    assert (row.request_id, row.feedback_rating, row.feedback_comment) == (rid, -1, None)
    assert row.feedback_better == "4. Mail me at [EMAIL]"  # redacted like every text of the log
    assert row.feedback_at is not None and row.context_turns == 1
    assert counted(h, "chat/2", "down") == 1.0

    assert body["reason"] is None and row.feedback_reason is None
    unsafe = await rate(h, {"response_id": rid, "rating": -1, "reason": "unsafe"})
    assert unsafe.status_code == 200 and unsafe.json()["reason"] == "unsafe"
    [row] = await h.log()
    assert (row.feedback_rating, row.feedback_reason) == (-1, "unsafe")

    again = await rate(h, {"response_id": rid, "rating": 1, "comment": "on second thought, fine"})
    assert again.status_code == 200
    [row] = await h.log()
    assert (row.feedback_rating, row.feedback_better, row.feedback_comment) == (1, None, "on second thought, fine")
    assert row.feedback_reason is None  # the latest rating replaces the earlier one, its reason too
    assert counted(h, "chat/2", "up") == 1.0
    metrics = (await h.request("GET", "/metrics")).text
    assert 'lifecycle_feedback_total{model_version="chat/2",rating="down"} 2.0' in metrics  # -1, then -1 unsafe


async def test_a_streamed_answer_is_rated_by_its_chunk_id(make_harness: MakeHarness) -> None:
    h = make_harness()
    streamed = await h.chat("hi", stream=True)
    rid = sse_events(streamed)[0]["id"]
    r = await rate(h, {"response_id": rid, "rating": 1})
    assert r.status_code == 200, r.text
    assert [row.feedback_rating for row in await h.log()] == [1]


async def test_only_the_key_that_asked_may_rate(make_harness: MakeHarness) -> None:
    h = make_harness()
    rid = (await h.chat()).json()["id"]
    theirs = await rate(h, {"response_id": rid, "rating": -1}, secret=h.other_secret)
    unknown = await rate(h, {"response_id": "chatcmpl-000000000000000000000000", "rating": -1})
    # another key's answer and an id that never existed read the same: ids leak nothing
    assert error(theirs, 404, "response_not_found", None) == error(unknown, 404, "response_not_found", None).replace(
        "chatcmpl-000000000000000000000000", rid
    )
    assert [row.feedback_rating for row in await h.log()] == [None]
    error(await rate(h, {"response_id": rid, "rating": 1}, secret="lc-not-a-key"), 401, "invalid_api_key", None)


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"rating": 1}, "response_id"),
        ({"response_id": "", "rating": 1}, "response_id"),
        ({"response_id": "x" * 101, "rating": 1}, "response_id"),
        ({"response_id": "R"}, "rating"),
        ({"response_id": "R", "rating": 0}, "rating"),
        ({"response_id": "R", "rating": 2}, "rating"),
        ({"response_id": "R", "rating": "1"}, "rating"),
        ({"response_id": "R", "rating": 1.0}, "rating"),
        ({"response_id": "R", "rating": True}, "rating"),
        ({"response_id": "R", "rating": 1, "better_answer": "Better."}, "better_answer"),
        ({"response_id": "R", "rating": -1, "better_answer": "x" * 101}, "better_answer"),
        ({"response_id": "R", "rating": -1, "comment": "x" * 101}, "comment"),
        ({"response_id": "R", "rating": -1, "comment": 5}, "comment"),
        ({"response_id": "R", "rating": -1, "stars": 5}, "stars"),
        ({"response_id": "R", "rating": 1, "reason": "unsafe"}, "reason"),
        ({"response_id": "R", "rating": -1, "reason": "rude"}, "reason"),
    ],
)
async def test_bad_input_is_a_422_naming_the_field(make_harness: MakeHarness, body: dict[str, Any], param: str) -> None:
    h = make_harness(serving={"limits": {"max_feedback_chars": 100}})
    rid = (await h.chat()).json()["id"]
    body = {k: (rid if v == "R" else v) for k, v in body.items()}
    error(await rate(h, body), 422, "invalid_value", param)
    assert [row.feedback_rating for row in await h.log()] == [None]


async def test_a_blank_better_answer_counts_as_none(make_harness: MakeHarness) -> None:
    h = make_harness()
    rid = (await h.chat()).json()["id"]
    assert (await rate(h, {"response_id": rid, "rating": -1, "better_answer": "  \n"})).json()["better_answer"] is False
    assert [row.feedback_better for row in await h.log()] == [None]


async def test_a_request_without_an_answer_cannot_be_rated(make_harness: MakeHarness) -> None:
    h = make_harness()
    refused = await h.chat(model="nope")  # refused before generation: a row of route "rejected", no response
    assert refused.status_code == 404
    assert [row.route for row in await h.log()] == ["rejected"]
    error(
        await rate(h, {"response_id": refused.headers["x-request-id"], "rating": -1}), 404, "response_not_found", None
    )
    failed = RequestLogEntry(  # a request that failed on its engine: a response, but no answer in it
        request_id="chatcmpl-failed",
        at=datetime.now(UTC),
        model="chat",
        status="error",
        http_status=503,
        key_id=h.key.id,
        model_version="chat/2",
        route="primary",
    )
    h.runtime.gateway.store.log_request(failed)
    r = await rate(h, {"response_id": "chatcmpl-failed", "rating": -1})
    assert "no answer to rate" in error(r, 400, "response_not_rateable", "response_id")


async def test_the_route_is_in_the_openapi_document(make_harness: MakeHarness) -> None:
    h = make_harness()
    doc = (await h.request("GET", "/openapi.json")).json()
    op = doc["paths"]["/v1/feedback"]["post"]
    assert op["tags"] == ["extension"]
    assert op["requestBody"]["content"]["application/json"]["schema"]["$ref"].endswith("/FeedbackRequest")
    schema = doc["components"]["schemas"]["FeedbackRequest"]
    assert schema["additionalProperties"] is False and set(schema["required"]) == {"response_id", "rating"}
    assert {"200", "400", "401", "404", "422"} <= set(op["responses"])
