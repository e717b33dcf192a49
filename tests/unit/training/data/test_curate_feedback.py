"""Feedback curation rules on hand-made rated answers and a fake safety checker: a thumbs down with a better answer
is a pair; a thumbs down without one pairs with an answer rated up for the same prompt; consent, completed answers,
a known prompt, safety of the prompt and the chosen side, held-out prompts, contracts (chosen != rejected),
scrubbing, dedup, and the same file for the same feedback in any order. Every record passes the snapshot's record
contract as prompt + chosen and prompt + rejected, and the preference stage's pair parser."""

from __future__ import annotations

import json
import random
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from unit.training.data.test_curate import FakeChecker

from training.config import SnapshotConfig
from training.data.curate import provenance_id
from training.data.curate_feedback import SOURCE, PreferenceReport, SourceFeedback, curate_feedback
from training.data.pairs import parse_pair
from training.data.records import Message, normalize_text, parse_record

T0 = datetime(2026, 11, 20, 12, 0, tzinfo=UTC)
LIMITS = SnapshotConfig()
Q = (Message("user", "What is 2 + 2?"),)
_ids = iter(range(10**6))


def fb(
    rating: int,
    reply: str,
    better: str | None = None,
    *,
    prompt: tuple[Message, ...] | None = Q,
    minute: int = 0,
    key: str = "key_1",
    status: str = "ok",
    opted_in: bool = True,
    deleted: bool = False,
    rid: str | None = None,
) -> SourceFeedback:
    return SourceFeedback(
        rid or f"chatcmpl-{next(_ids)}",
        key,
        "chat/3",
        status,
        rating,
        T0 + timedelta(minutes=minute),
        opted_in,
        deleted,
        prompt,
        reply,
        better,
    )


def run(*rated: SourceFeedback, **kwargs: Any) -> tuple[list[dict[str, Any]], PreferenceReport]:
    curation = curate_feedback(rated, checker=kwargs.pop("checker", FakeChecker()), limits=LIMITS, **kwargs)
    lines = [json.loads(line) for line in curation.jsonl().splitlines()]
    for obj in lines:  # the agreed format, valid under training.data.records
        assert set(obj) == {"messages", "chosen", "rejected", "metadata"}
        for side in ("chosen", "rejected"):
            parse_record({"messages": [*obj["messages"], {"role": "assistant", "content": obj[side]}]}, LIMITS)
        assert normalize_text(obj["chosen"]) != normalize_text(obj["rejected"])
        assert obj["metadata"]["source"] == SOURCE
        parse_pair(obj, LIMITS)  # and the preference stage's own parser takes it
        assert all(v is None or isinstance(v, str | int | float | bool) for v in obj["metadata"].values())
    report = curation.report
    json.dumps(report.to_json())
    assert report.rated == len(rated)
    return lines, report


def test_a_thumbs_down_with_a_better_answer_is_a_pair() -> None:
    down = fb(-1, "5", "4", rid="chatcmpl-a", key="key_9")
    [pair], report = run(down)
    assert pair["messages"] == [{"role": "user", "content": "What is 2 + 2?"}]
    assert (pair["chosen"], pair["rejected"]) == ("4", "5")
    meta = pair["metadata"]
    assert (meta["pairing"], meta["model_version"], meta["chosen_response"]) == ("better_answer", "chat/3", None)
    assert meta["rejected_response"] == provenance_id("response", "chatcmpl-a")
    assert meta["key"] == provenance_id("key", "key_9")
    assert "chatcmpl-a" not in json.dumps(pair) and "key_9" not in json.dumps(pair)
    assert (report.pairs, report.better_answer_pairs, report.used, report.unpaired) == (1, 1, 1, 0)


def test_thumbs_up_and_down_on_the_same_prompt_make_a_pair_and_lone_ratings_do_not() -> None:
    up = fb(1, "4", minute=1)
    down = fb(-1, "5", minute=2)
    lone_down = fb(-1, "Paris", prompt=(Message("user", "Capital of Spain?"),), minute=3)
    lone_up = fb(1, "Blue", prompt=(Message("user", "Colour of the sky?"),), minute=4)
    same = fb(1, "5", minute=5)  # rated up but the same text as the rated-down answer: no pair with it
    [pair], report = run(down, lone_up, up, same, lone_down)
    assert (pair["chosen"], pair["rejected"], pair["metadata"]["pairing"]) == ("4", "5", "rated")
    assert pair["metadata"]["chosen_response"] == provenance_id("response", up.response_id)
    assert (report.pairs, report.rated_pairs, report.used, report.unpaired) == (1, 1, 2, 3)


def test_a_pair_keeps_the_context_the_model_answered() -> None:
    prompt = (
        Message("system", "Be brief."),
        Message("user", "Hi"),
        Message("assistant", "Hello!"),
        Message("user", "What is 2 + 2?"),
    )
    [pair], _ = run(fb(-1, "5", "4", prompt=prompt))
    assert [(m["role"], m["content"]) for m in pair["messages"]] == [(m.role, m.content) for m in prompt]


@pytest.mark.parametrize(
    ("rated", "outcome"),
    [
        (fb(-1, "5", "4", opted_in=False), "not_opted_in"),
        (fb(-1, "5", "4", deleted=True), "deleted"),
        (fb(-1, "I can't help with that.", "4", status="content_filter"), "not_completed"),
        (fb(-1, "5", "4", prompt=None), "no_context"),
        (fb(-1, "5", "4", prompt=(Message("user", "BLOCKME now"),)), "unsafe"),
        (fb(-1, "5", "You TOXIC idiot"), "unsafe"),
        (fb(-1, "5", " 5 "), "invalid"),
        (fb(-1, "5", "x" * (LIMITS.max_message_chars + 1)), "invalid"),
        (fb(-1, "5", "4", prompt=(Message("assistant", "Hi"),)), "invalid"),
        (fb(-1, "5", "4", prompt=(Message("user", "An eval prompt"),)), "held_out"),
    ],
)
def test_each_rule_drops_what_it_should(rated: SourceFeedback, outcome: str) -> None:
    records, report = run(rated, held_out={"an eval prompt"})
    assert records == []
    assert report.to_json()[outcome] == 1 and report.pairs == 0


def test_the_rejected_side_is_not_filtered_but_a_chosen_answer_rated_up_is() -> None:
    kept, _ = run(fb(-1, "You TOXIC idiot", "Let me help."))  # a bad answer is what a pair pushes away from
    assert kept[0]["rejected"] == "You TOXIC idiot"
    records, report = run(fb(1, "TOXIC but liked", minute=1), fb(-1, "5", minute=2))
    assert records == [] and report.unsafe_rules == {"chosen:toxicity": 1} and report.unpaired == 1


def test_every_text_is_scrubbed_and_marked() -> None:
    prompt = (Message("user", "Mail jo@example.com the sum of 2 + 2"),)
    [pair], report = run(fb(-1, "Sent to jo@example.com: 5", "4, call +1 415-555-0100", prompt=prompt))
    text = json.dumps(pair)
    assert "jo@example.com" not in text and "415-555-0100" not in text
    assert pair["metadata"]["scrubbed"] is True and report.scrubbed == 1
    assert report.redactions == {"email": 2, "phone": 1}


def test_identical_pairs_are_kept_once_and_the_result_does_not_depend_on_order() -> None:
    rated = [fb(-1, "5", "4", minute=i, key=f"key_{i}") for i in range(3)] + [fb(-1, "5", "four", minute=9)]
    records, report = run(*rated)
    assert [r["chosen"] for r in records] == ["4", "four"] and report.duplicate == 2
    shuffled = rated[:]
    random.Random(0).shuffle(shuffled)
    first = curate_feedback(rated, checker=FakeChecker(), limits=LIMITS).jsonl()
    assert curate_feedback(shuffled, checker=FakeChecker(), limits=LIMITS).jsonl() == first
