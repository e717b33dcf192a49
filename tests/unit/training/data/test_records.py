from __future__ import annotations

from typing import Any

import pytest

from training.config import SnapshotConfig
from training.data.records import ChatRecord, RecordInvalid, parse_record

LIMITS = SnapshotConfig(max_messages=6, max_message_chars=50, max_total_chars=80)


def msgs(*pairs: tuple[str, Any]) -> dict[str, Any]:
    return {"messages": [{"role": r, "content": c} for r, c in pairs]}


@pytest.mark.parametrize(
    ("obj", "code", "fragment"),
    [
        ([], "schema", "must be a JSON object"),
        ({"messages": []}, "schema", "non-empty list"),
        ({"messages": "hi"}, "schema", "non-empty list"),
        ({"messages": [], "id": 3}, "schema", "unknown field(s) id"),
        (msgs(("user", "hi"), ("bot", "yo")), "schema", "role must be one of"),
        ({"messages": [{"role": "user", "content": "hi", "name": "x"}]}, "schema", "unknown field(s) name"),
        (msgs(("user", 3), ("assistant", "x")), "schema", "content must be a string"),
        (msgs(("assistant", "x")), "role_order", "'user' was expected"),
        (msgs(("user", "a"), ("user", "b")), "role_order", "'assistant' was expected"),
        (msgs(("user", "a"), ("assistant", "b"), ("system", "c")), "role_order", "'user' was expected"),
        (msgs(("user", "a")), "role_order", "last message must be an assistant"),
        (msgs(("system", "s")), "role_order", "at least one user"),
        (msgs(("user", "a"), ("assistant", "   ")), "empty_turn", "(assistant) is empty"),
        (msgs(("user", ""), ("assistant", "b")), "empty_turn", "(user) is empty"),
        (msgs(("user", "x" * 51), ("assistant", "b")), "too_long", "51 characters"),
        (msgs(("user", "x" * 45), ("assistant", "y" * 45)), "too_long", "max_total_chars=80"),
        (msgs(*[("user", "a"), ("assistant", "b")] * 4), "too_long", "max_messages=6"),
        (
            {**msgs(("user", "a"), ("assistant", "b")), "metadata": {"k": [1]}},
            "schema",
            "'metadata' must map",
        ),
    ],
)
def test_contract_violations_have_a_code_and_reason(obj: Any, code: str, fragment: str) -> None:
    with pytest.raises(RecordInvalid) as err:
        parse_record(obj, LIMITS)
    assert err.value.code == code
    assert fragment in err.value.reason


def test_valid_record_is_normalized() -> None:
    record = parse_record(
        {
            "messages": [
                {"role": "system", "content": ""},
                {"role": "user", "content": " Cafe\u0301?\r\n"},
                {
                    "role": "assistant",
                    "content": [{"type": "text", "text": "Yes"}, {"type": "text", "text": "!"}],
                },
            ],
            "metadata": {"skill": "x"},
        },
        LIMITS,
    )
    assert [m.content for m in record.messages] == ["", "Caf\u00e9?", "Yes!"]
    assert record.to_json()["metadata"] == {"skill": "x"}


def test_keys_separate_exact_normalized_and_prompt_identity() -> None:
    a = parse_record(msgs(("user", "What is 2+2?"), ("assistant", "4")), LIMITS)
    b = parse_record(msgs(("user", "what   IS 2+2?"), ("assistant", "4")), LIMITS)
    c = parse_record(msgs(("user", "What is 2+2?"), ("assistant", "Four")), LIMITS)
    assert a.canonical() != b.canonical()
    assert a.dedup_key == b.dedup_key  # a normalized duplicate
    assert a.dedup_key != c.dedup_key  # a different answer is not a duplicate...
    assert a.prompt_key == c.prompt_key  # ...but the same prompt, so the same split
    assert isinstance(a, ChatRecord) and a.completion == "4"
