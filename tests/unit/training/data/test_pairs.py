"""Preference pairs: the record contract (training/data/pairs.py), the pair generator (training/data/synth_pairs.py)
and pair snapshots (training/data/snapshot.py with kind=PAIRS)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from support.helpers import chat, write_jsonl

from core.errors import InvalidRecordsError
from core.refusal import is_compliance, is_refusal
from training.config import GeneratorConfig, PairDataConfig, PreferenceConfig, SnapshotConfig
from training.data.pairs import parse_pair
from training.data.records import RecordInvalid, loose_text, parse_record
from training.data.snapshot import PAIRS, build_snapshot
from training.data.synth_pairs import generate_pairs
from training.data.synth_pools import BENIGN_TWINS, HARMFUL, TOXIC_REPLIES

NUMBER = re.compile(r"-?\d+")
LIMITS = SnapshotConfig(validation_fraction=0.2, test_fraction=0.2)


def pair(
    user: str = "How do I kill a Python process?",
    chosen: str = "Run kill <pid>.",
    rejected: str = "I'm sorry, but I can't help with that.",
    **extra: Any,
) -> dict[str, Any]:
    return {
        "messages": [{"role": "user", "content": user}],
        "chosen": chosen,
        "rejected": rejected,
        "metadata": {"source": "feedback"},
        **extra,
    }


def test_a_pair_is_normalized_and_keyed_like_a_chat_record_with_the_same_prompt() -> None:
    record = parse_pair(pair(user="  How do I kill a Python process?\r\n", chosen="Run kill <pid>.  "), LIMITS)
    assert record.messages[0].content == "How do I kill a Python process?" and record.chosen == "Run kill <pid>."
    as_chat = parse_record(chat("how do I  KILL a python process?", "anything"), LIMITS)
    assert record.prompt_key == as_chat.prompt_key  # splits by prompt exactly as chat snapshots do
    assert parse_pair(pair(), LIMITS).dedup_key != parse_pair(pair(rejected="No."), LIMITS).dedup_key


@pytest.mark.parametrize(
    ("obj", "code", "message"),
    [
        (pair(chosen="Same  reply", rejected="same reply"), "same_replies", "are the same reply"),
        (pair(chosen=""), "empty_turn", "'chosen' is empty"),
        (pair(rejected=3), "schema", "'rejected' must be a string"),
        (pair(extra=1), "schema", "unknown field(s) extra"),
        ({**pair(), "metadata": {}}, "schema", "metadata.source must be one of synthetic, feedback"),
        (
            {**pair(), "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]},
            "role_order",
            "the last message must be a user turn",
        ),
        ({**pair(), "messages": []}, "schema", "'messages' must be a non-empty list"),
        (pair(chosen="x" * 9000), "too_long", "'chosen' has 9000 characters"),
    ],
)
def test_broken_pairs_are_rejected_with_a_reason(obj: dict[str, Any], code: str, message: str) -> None:
    with pytest.raises(RecordInvalid) as info:
        parse_pair(obj, LIMITS)
    assert info.value.code == code and message in info.value.reason


GEN = GeneratorConfig()


@pytest.fixture(scope="module")
def pairs() -> list[dict[str, Any]]:
    return generate_pairs(PreferenceConfig().data, GEN, exclude=set())


def _kind(pairs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [p for p in pairs if p["metadata"]["kind"] == kind]


def test_generated_pairs_prefer_what_the_suites_reward(pairs: list[dict[str, Any]]) -> None:
    counts = PreferenceConfig().data.counts
    for kind, want in counts.items():
        assert len(_kind(pairs, kind)) == want, kind
    for p in _kind(pairs, "refusal"):
        assert is_refusal(p["chosen"]) and is_compliance(p["rejected"])
    for p in _kind(pairs, "borderline"):
        assert is_compliance(p["chosen"]) and is_refusal(p["rejected"])
    for p in _kind(pairs, "provocation"):
        assert p["rejected"] in TOXIC_REPLIES and p["rejected"] != p["chosen"]
    for p in _kind(pairs, "arithmetic") + _kind(pairs, "unit_conversion"):  # only the stated number differs
        assert p["chosen"] != p["rejected"] and NUMBER.sub("#", p["chosen"]) == NUMBER.sub("#", p["rejected"])
    for p in _kind(pairs, "facts"):
        assert p["chosen"] != p["rejected"] and p["chosen"].split()[:4] == p["rejected"].split()[:4]
    for p in pairs:  # every generated pair passes the contract
        assert parse_pair(p, LIMITS).metadata["source"] == "synthetic"


def test_refusal_and_borderline_pairs_are_each_others_mistakes(pairs: list[dict[str, Any]]) -> None:
    """A harmful request's rejected reply is the helpful answer its benign twin gets, of the harmful subject; a
    benign twin's rejected reply is the refusal of the category it mirrors: the replies of both kinds come from
    the same two texts per category, so only the subject tells them apart."""
    twin_reply = {cat: reply for cat, _, reply in BENIGN_TWINS}
    refusal_of = {cat: refusal for cat, _, _, refusal in HARMFUL}
    for p in _kind(pairs, "refusal"):
        cat = next(c for c, r in refusal_of.items() if r == p["chosen"])
        subjects = next(xs for c, _, xs, _ in HARMFUL if c == cat)
        said = [x for x in subjects if p["rejected"] == twin_reply[cat].format(x=x)]
        assert any(x in p["messages"][0]["content"] for x in said), p
    mirrored = 0
    for p in _kind(pairs, "borderline"):
        for cat, xs, reply in BENIGN_TWINS:
            if any(p["chosen"] == reply.format(x=x) for x in xs):
                assert p["rejected"] == refusal_of[cat]
                mirrored += 1
    assert mirrored > len(_kind(pairs, "borderline")) // 2


def test_generation_is_seeded_and_never_draws_an_excluded_prompt(pairs: list[dict[str, Any]]) -> None:
    assert generate_pairs(PreferenceConfig().data, GEN, exclude=set()) == pairs
    excluded = {loose_text(p["messages"][0]["content"]) for p in pairs[::3]}
    again = generate_pairs(PreferenceConfig().data, GEN, exclude=excluded)
    assert not {loose_text(p["messages"][0]["content"]) for p in again} & excluded
    other_seed = generate_pairs(PairDataConfig(seed=7, counts={"refusal": 20}), GEN, exclude=set())
    assert [p["messages"] for p in other_seed] != [p["messages"] for p in _kind(pairs, "refusal")[:20]]


def test_pair_snapshot_splits_by_prompt_and_is_content_addressed(tmp_path: Path, pairs: list[dict[str, Any]]) -> None:
    src = write_jsonl(tmp_path / "pairs.jsonl", pairs)
    snap = build_snapshot(LIMITS, [src], tmp_path / "snaps", reports=tmp_path / "reports", kind=PAIRS)
    assert snap.manifest["kind"] == "preference" and sum(snap.manifest["counts"].values()) == len(pairs)
    assert snap.manifest["skills"]["train"]["refusal"] > 0
    again = build_snapshot(
        LIMITS, [write_jsonl(tmp_path / "b.jsonl", pairs[::-1])], tmp_path / "other", reports=tmp_path / "r", kind=PAIRS
    )
    assert again.hash == snap.hash
    train_prompts = {loose_text(r["messages"][-1]["content"]) for r in snap.records("train")}
    test_prompts = {loose_text(r["messages"][-1]["content"]) for r in snap.records("test")}
    assert train_prompts and test_prompts and not train_prompts & test_prompts


def test_a_pair_whose_prompt_is_an_eval_prompt_fails_or_is_dropped_and_counted(
    tmp_path: Path, pairs: list[dict[str, Any]]
) -> None:
    src = write_jsonl(tmp_path / "pairs.jsonl", pairs[:30])
    holdout = {loose_text(pairs[4]["messages"][0]["content"])}
    with pytest.raises(InvalidRecordsError) as info:
        build_snapshot(LIMITS, [src], tmp_path / "s", reports=tmp_path / "r", kind=PAIRS, holdout=holdout)
    assert [p.code for p in info.value.problems] == ["eval_leak"]
    drop = LIMITS.model_copy(update={"on_invalid": "drop"})
    snap = build_snapshot(drop, [src], tmp_path / "s", reports=tmp_path / "r", kind=PAIRS, holdout=holdout)
    assert snap.manifest["rejected"]["by_reason"] == {"eval_leak": 1}
    assert sum(snap.manifest["counts"].values()) == 29
