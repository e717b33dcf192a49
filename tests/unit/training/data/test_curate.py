"""Curation rules on hand-made conversations and a fake safety checker: consent, the window, completed exchanges only,
safety (refusals kept), scrubbing, snapshot contracts, held-out prompts, dedup, provenance without raw ids, and
the same records for the same conversations in any order."""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

import pytest

from training.config import SnapshotConfig
from training.data.curate import (
    SOURCE,
    CurationReport,
    SourceConversation,
    SourceTurn,
    curate,
    prompt_keys,
    provenance_id,
)
from training.data.records import Message, loose_text, parse_record

T0 = datetime(2026, 11, 20, 12, 0, tzinfo=UTC)
LIMITS = SnapshotConfig()


class FakeChecker:
    """Blocks a prompt with BLOCKME in a user turn and a reply containing TOXIC; records what it was shown."""

    def __init__(self) -> None:
        self.prompts: list[list[Message]] = []
        self.replies: list[str] = []

    def check_prompt(self, messages: Sequence[Message]) -> str | None:
        self.prompts.append(list(messages))
        return "injection.fake" if any("BLOCKME" in m.content for m in messages if m.role == "user") else None

    def check_reply(self, text: str) -> str | None:
        self.replies.append(text)
        return "toxicity" if "TOXIC" in text else None


def conv(
    *exchanges: tuple[str, str] | tuple[str, str, str | None],
    id: str = "conv_a",
    key: str = "key_1",
    at: datetime = T0,
    system: str | None = None,
    opted_in: bool = True,
    deleted: bool = False,
    extra: Sequence[SourceTurn] = (),
) -> SourceConversation:
    """Exchanges (user, reply[, status]) one minute apart from ``at``; ``extra`` turns go first."""
    turns: list[SourceTurn] = list(extra)
    for i, ex in enumerate(exchanges):
        user, reply = ex[0], ex[1]
        status = ex[2] if len(ex) == 3 else "ok"  # type: ignore[misc]
        t = at + timedelta(minutes=i)
        turns += [SourceTurn("user", user, t), SourceTurn("assistant", reply, t, "chat/3", status)]
    return SourceConversation(id, key, system, opted_in, deleted, tuple(turns))


def run(*convs: SourceConversation, **kwargs: object) -> tuple[list[dict[str, object]], CurationReport]:
    curation = curate(convs, checker=kwargs.pop("checker", FakeChecker()), limits=LIMITS, **kwargs)  # type: ignore[arg-type]
    lines = [json.loads(line) for line in curation.jsonl().splitlines()]
    assert [parse_record(obj, LIMITS) for obj in lines] == list(curation.records)  # valid snapshot input
    json.dumps(curation.report.to_json())  # JSON-able
    return lines, curation.report


def texts(record: dict[str, object]) -> list[tuple[str, str]]:
    return [(m["role"], m["content"]) for m in record["messages"]]  # type: ignore[attr-defined]


def test_a_completed_exchange_becomes_a_record_with_hashed_provenance() -> None:
    [record], report = run(conv(("What is 2 + 3?", "5.")))
    assert texts(record) == [("user", "What is 2 + 3?"), ("assistant", "5.")]
    assert record["metadata"] == {
        "source": SOURCE,
        "conversation": provenance_id("conversation", "conv_a"),
        "key": provenance_id("key", "key_1"),
        "turn": 1,
        "model_version": "chat/3",
        "scrubbed": False,
        "refusal": False,
    }
    assert "conv_a" not in json.dumps(record) and "key_1" not in json.dumps(record)
    assert (report.read, report.turns, report.kept) == (1, 1, 1)


def test_only_opted_in_and_undeleted_conversations_are_used() -> None:
    lines, report = run(
        conv(("a?", "A."), id="c1", opted_in=False),
        conv(("b?", "B."), id="c2", deleted=True),
        conv(("c?", "C."), id="c3", opted_in=False, deleted=True),
        conv(("d?", "D."), id="c4"),
    )
    assert [texts(r)[0][1] for r in lines] == ["d?"]
    assert (report.read, report.not_opted_in, report.deleted, report.turns, report.kept) == (4, 2, 1, 1, 1)


def test_each_exchange_is_a_record_with_the_conversation_before_it_as_context() -> None:
    c = conv(("Hi", "Hello."), ("What is 2 + 2?", "4."), system="Be brief.")
    lines, report = run(c)
    assert [texts(r) for r in lines] == [
        [("system", "Be brief."), ("user", "Hi"), ("assistant", "Hello.")],
        [
            ("system", "Be brief."),
            ("user", "Hi"),
            ("assistant", "Hello."),
            ("user", "What is 2 + 2?"),
            ("assistant", "4."),
        ],
    ]
    assert [r["metadata"]["turn"] for r in lines] == [1, 2]  # type: ignore[index]
    system_turn = SourceTurn("system", "From the client.", T0)
    [first, _], _ = run(conv(("Hi", "Hello."), ("Bye", "Bye."), extra=[system_turn]))
    assert texts(first)[0] == ("system", "From the client.")


def test_the_window_takes_new_replies_and_keeps_older_ones_as_context() -> None:
    c = conv(("one", "1"), ("two", "2"), ("three", "3"))  # replies at T0, T0+1m, T0+2m
    lines, report = run(c, since=T0 + timedelta(minutes=1), until=T0 + timedelta(minutes=2))
    assert [texts(r)[-2:] for r in lines] == [[("user", "two"), ("assistant", "2")]]
    assert texts(lines[0])[:2] == [("user", "one"), ("assistant", "1")]
    assert (report.turns, report.kept) == (1, 1)


@pytest.mark.parametrize(
    ("exchange", "outcome"),
    [
        (("BLOCKME please", "ok"), "unsafe"),
        (("hello", "you are TOXIC"), "unsafe"),
        (("hello", "I'm sorry, but I can't help with that request.", "content_filter"), "not_completed"),
        (("hello", "", "ok"), "invalid"),
        (("x" * 9000, "long"), "invalid"),
    ],
)
def test_a_dropped_exchange_ends_its_conversation(exchange: tuple[str, ...], outcome: str) -> None:
    lines, report = run(conv(("first", "1"), exchange, ("after", "2")))  # type: ignore[arg-type]
    assert [texts(r)[-2][1] for r in lines] == ["first"]  # the exchange and everything after it are gone
    assert getattr(report, outcome) == 1 and report.context_dropped == 1
    assert report.turns == 3 and report.kept == 1


def test_unsafe_rules_are_counted_by_stage_and_the_checker_sees_the_text_as_written() -> None:
    checker = FakeChecker()
    _, report = run(
        conv(("BLOCKME", "x"), id="c1"),
        conv(("fine", "TOXIC"), id="c2"),
        conv(("mail jo@example.com", "ok"), id="c3"),
        checker=checker,
    )
    assert report.unsafe == 2
    assert report.unsafe_rules == {"prompt:injection.fake": 1, "reply:toxicity": 1}
    assert [m.content for m in checker.prompts[-1]] == ["mail jo@example.com"]  # not the scrubbed text


def test_the_prompt_check_sees_the_earlier_turns_too() -> None:
    checker = FakeChecker()
    run(conv(("first", "1"), ("second", "2"), system="sys"), checker=checker)
    assert [[m.content for m in p] for p in checker.prompts] == [["sys", "first"], ["sys", "first", "1", "second"]]


def test_refusals_are_kept_marked_and_counted() -> None:
    refusal = "I'm sorry, but I can't help with building weapons. I can explain how to stay safe instead."
    [record], report = run(conv(("How do I build a weapon?", refusal)))
    assert record["metadata"]["refusal"] is True  # type: ignore[index]
    assert (report.kept, report.refusals) == (1, 1)


def test_a_reply_without_a_log_row_is_taken_as_stored() -> None:
    [record], report = run(conv(("q?", "a.", None)))
    assert texts(record)[-1] == ("assistant", "a.") and report.not_completed == 0


def test_anything_but_user_then_assistant_is_malformed() -> None:
    t = T0
    tool = SourceConversation(
        "c1",
        "k",
        None,
        True,
        False,
        (SourceTurn("user", "q", t), SourceTurn("tool", "{}", t), SourceTurn("assistant", "a", t, "chat/3", "ok")),
    )
    two_users = SourceConversation(
        "c2",
        "k",
        None,
        True,
        False,
        (
            SourceTurn("user", "ok?", t),
            SourceTurn("assistant", "ok.", t, None, "ok"),
            SourceTurn("user", "q1", t),
            SourceTurn("user", "q2", t),
            SourceTurn("assistant", "a", t, None, "ok"),
            SourceTurn("user", "later", t),
            SourceTurn("assistant", "b", t, None, "ok"),
        ),
    )
    lines, report = run(tool, two_users)
    assert [texts(r)[-2][1] for r in lines] == ["ok?"]
    assert (report.malformed, report.context_dropped, report.kept) == (2, 1, 1)


def test_pii_is_scrubbed_everywhere_and_the_record_marked() -> None:
    c = conv(
        ("Mail jo@example.com or call +1 415-555-0100", "Noted: jo@example.com."),
        ("And my card 4111 1111 1111 1111?", "Never share a card number."),
        ("Thanks", "You're welcome."),
        system="Support for ops@example.com",
        id="c1",
    )
    lines, report = run(c, conv(("What is 1 + 1?", "2."), id="c2"))
    dump = json.dumps(lines)
    for secret in ("jo@example.com", "415-555-0100", "4111 1111 1111 1111", "ops@example.com"):
        assert secret not in dump
    assert texts(lines[0])[1] == ("user", "Mail [EMAIL] or call [PHONE]")
    assert texts(lines[0])[2] == ("assistant", "Noted: [EMAIL].")
    # by reply time: c1's first exchange, c2's (no PII), then c1's later ones (PII in their context)
    assert [r["metadata"]["scrubbed"] for r in lines] == [True, False, True, True]  # type: ignore[index]
    assert report.scrubbed == 3
    assert report.redactions == {"email": 2, "phone": 1, "card": 1}  # of the kept exchanges' own turns


def test_prompts_already_in_the_data_or_earlier_in_the_batch_are_duplicates() -> None:
    existing = prompt_keys(
        [{"messages": [{"role": "user", "content": "what is 2+2?"}, {"role": "assistant", "content": "4"}]}]
    )
    later = conv(("Tell me a joke", "Later answer."), id="c_later", at=T0 + timedelta(hours=1))
    earlier = conv(("tell  me a JOKE", "Earlier answer."), id="c_zzz")
    lines, report = run(later, earlier, conv(("What is 2+2?", "Four."), id="c3"), existing=existing)
    assert [texts(r)[-1][1] for r in lines] == ["Earlier answer."]  # the earliest reply wins, whatever the order
    assert (report.duplicate, report.kept) == (2, 1)


def test_prompts_of_the_eval_sets_are_held_out() -> None:
    held = {loose_text("What is the capital of Veloria?")}
    lines, report = run(conv(("what is the capital of  veloria?", "Mirat."), ("ok", "ok")), held_out=held)
    assert lines == [] and (report.held_out, report.context_dropped) == (1, 1)


def test_same_conversations_in_any_order_give_the_same_bytes() -> None:
    convs = [
        conv((f"q{i}", f"a{i}"), (f"r{i}", f"b{i}"), id=f"c{i:02d}", at=T0 + timedelta(seconds=i)) for i in range(12)
    ]
    first = curate(convs, checker=FakeChecker(), limits=LIMITS).jsonl()
    shuffled = convs[:]
    random.Random(7).shuffle(shuffled)
    assert curate(shuffled, checker=FakeChecker(), limits=LIMITS).jsonl() == first
    assert len(first.splitlines()) == 24


def test_every_candidate_has_one_outcome() -> None:
    _, report = run(
        conv(("a", "1"), ("BLOCKME", "2"), ("c", "3"), id="c1"),
        conv(("a", "1"), id="c2"),  # duplicate of c1's first exchange
        conv(("z", "TOXIC"), id="c3"),
        conv(("y", "y", "content_filter"), id="c4", opted_in=False),
    )
    outcomes = ("not_completed", "malformed", "unsafe", "invalid", "held_out", "context_dropped", "duplicate", "kept")
    assert report.turns == sum(getattr(report, name) for name in outcomes) == 5
    assert report.to_json()["unsafe_rules"] == {"prompt:injection.fake": 1, "reply:toxicity": 1}
