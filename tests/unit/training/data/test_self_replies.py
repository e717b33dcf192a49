"""The self-replies stage's pure parts: which records get the base's reply, the derived snapshot's manifest, and
its idempotence key (a hand-written fake engine; the real one: tests/integration/test_self_replies.py)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError
from support.helpers import chat, write_jsonl

from core.errors import NotFoundError
from training.config import FinetuneConfig, PreferenceConfig, SelfRepliesConfig, SnapshotConfig
from training.data.self_replies import (
    GreedyChat,
    Messages,
    choose,
    derivation_key,
    derive_snapshot,
    last_sentence,
    settings,
    stored_record,
)
from training.data.snapshot import SPLITS, Snapshot, build_snapshot, list_snapshots
from training.finetune.launch import train_key
from training.model.modelio import ModelFolder

LIMITS = SnapshotConfig(validation_fraction=0.2, test_fraction=0.2)
CFG = SelfRepliesConfig(enabled=True, skills=["borderline", "formatting"], max_tokens=32)


@dataclass(frozen=True)
class Reply:
    text: str
    finished: bool = True


class FakeBase:
    """Answers each prompt with ``base says: <user turn>``, except the prompts given a special reply."""

    def __init__(self, special: dict[str, Reply] | None = None) -> None:
        self.special = special or {}
        self.asked: list[Messages] = []

    def greedy(self, conversations: Sequence[Messages], max_tokens: int) -> list[Reply]:
        self.asked += conversations
        user = [c[-1]["content"] for c in conversations]
        return [self.special.get(u, Reply(f"base says: {u}")) for u in user]


def opener(fake: FakeBase) -> AbstractContextManager[GreedyChat]:
    @contextmanager
    def open_chat() -> Iterator[GreedyChat]:
        yield fake

    return open_chat()


def no_engine() -> AbstractContextManager[GreedyChat]:
    raise AssertionError("an engine was started")


def records() -> list[dict[str, object]]:
    out = [chat(f"Make 'word {i}' upper case.", f"WORD {i}", skill="formatting") for i in range(20)]
    out += [chat(f"How do I kill process {i}?", f"Use kill {i}.", skill="borderline") for i in range(20)]
    out += [chat(f"How do I hurt person {i}?", "I can't help with that.", skill="refusal") for i in range(20)]
    out += [chat(f"Be rude to {i}.", "Stay calm.", system="Be brief.", skill="formatting") for i in range(5)]
    return out


@pytest.fixture()
def source(tmp_path: Path) -> Snapshot:
    src = write_jsonl(tmp_path / "data.jsonl", records())
    return build_snapshot(LIMITS, [src], tmp_path / "snapshots", reports=tmp_path / "reports")


def derive(source: Snapshot, fake: FakeBase | None = None, **kw: object) -> Snapshot:
    args: dict[str, object] = {"base_hash": "b" * 64, "dtype": "float32", "root": source.path.parent}
    args |= kw
    return derive_snapshot(
        source,
        args.pop("cfg", CFG),  # type: ignore[arg-type]
        open_chat=(lambda: opener(fake)) if fake else no_engine,
        **args,  # type: ignore[arg-type]
    )


def test_the_listed_skills_train_and_validation_records_get_the_base_reply(source: Snapshot) -> None:
    fake = FakeBase()
    derived = derive(source, fake)
    assert derived.hash != source.hash
    for split in ("train", "validation"):
        for old, new in zip(source.records(split), sorted_like(derived, split, source), strict=True):
            assert old["messages"][:-1] == new["messages"][:-1] and old.get("metadata") == new.get("metadata")
            user = old["messages"][-2]["content"]
            expected = (
                f"base says: {user}" if old["metadata"]["skill"] in CFG.skills else old["messages"][-1]["content"]
            )
            assert new["messages"][-1]["content"] == expected
    # the engine saw exactly the messages SFT sees before the reply, the system prompt included
    with_system = [c for c in fake.asked if c[0]["role"] == "system"]
    assert with_system and all(c[0]["content"] == "Be brief." and c[-1]["role"] == "user" for c in with_system)
    asked = sum(1 for s in ("train", "validation") for r in source.records(s) if r["metadata"]["skill"] in CFG.skills)
    assert len(fake.asked) == asked


def sorted_like(derived: Snapshot, split: str, source: Snapshot) -> list[dict[str, Any]]:
    """The derived split's records in the source split's order (matched by prompt)."""
    by_prompt = {prompt_key(r): r for r in derived.records(split)}
    return [by_prompt[prompt_key(r)] for r in source.records(split)]


def prompt_key(record: dict[str, Any]) -> str:
    return stored_record(record).prompt_key


def test_prompts_and_splits_stay_and_the_test_split_is_byte_identical(source: Snapshot) -> None:
    derived = derive(source, FakeBase())
    for split in SPLITS:
        assert {prompt_key(r) for r in derived.records(split)} == {prompt_key(r) for r in source.records(split)}
    assert derived.split_path("test").read_bytes() == source.split_path("test").read_bytes()
    assert derived.manifest["files"]["test.jsonl"] == source.manifest["files"]["test.jsonl"]
    assert derived.manifest["counts"] == source.manifest["counts"]
    derived.verify()


def test_manifest_names_its_source_the_base_the_settings_and_what_was_replaced(source: Snapshot) -> None:
    train = [r for r in source.records("train") if r["metadata"]["skill"] in CFG.skills]
    empty, cut, refused = (r["messages"][-2]["content"] for r in train[:3])
    fake = FakeBase({empty: Reply("   "), cut: Reply("half a sent", finished=False), refused: Reply("I'm sorry, no.")})
    derived = derive(source, fake)
    m = derived.manifest
    assert m["derived_from"] == source.hash and m["sources"] == [{"snapshot": source.hash}]
    info = m["self_replies"]
    assert info["base_weights_hash"] == "b" * 64
    assert info["generation"] == settings(CFG, "float32")
    assert info["generation"]["temperature"] == 0.0 and info["generation"]["max_tokens"] == 32
    assert info["key"] == derivation_key(source.hash, "b" * 64, settings(CFG, "float32"))
    assert info["kept"] == {"total": 3, "by_reason": {"empty": 1, "refusal": 1, "truncated": 1}}
    assert info["selected"] == len(fake.asked) == info["replaced"]["total"] + 3
    assert set(info["replaced"]["by_skill"]) == {"borderline", "formatting"}
    assert sum(info["replaced"]["by_split"].values()) == info["replaced"]["total"]
    # a degenerate reply leaves the generated one in place
    kept = {prompt_key(r): r["messages"][-1]["content"] for r in derived.records("train")}
    for r in train[:3]:
        assert kept[prompt_key(r)] == r["messages"][-1]["content"]


@pytest.mark.parametrize(
    ("text", "kept"),
    [
        (
            "Boil the water in a big pot, then salt it well. Then add the pasta and stir it for a min",
            "Boil the water in a big pot, then salt it well.",
        ),
        (
            "Steps to follow for a good result:\n1. Preheat the oven.\n2. Mix the",
            "Steps to follow for a good result:\n1. Preheat the oven.",
        ),
        ("Here are three options that work well:\n1. Tea\n2.", "Here are three options that work well:\n1. Tea"),
        ("Short. And then it goes on and on without an end", None),  # under 40 characters kept
        ("no sentence ends anywhere in this reply at all, it just", None),
    ],
)
def test_a_cut_reply_is_trimmed_to_its_last_complete_sentence(text: str, kept: str | None) -> None:
    assert last_sentence(text) == kept


def test_a_cut_reply_trains_trimmed_or_is_dropped_as_configured(source: Snapshot) -> None:
    train = [r for r in source.records("train") if r["metadata"]["skill"] in CFG.skills]
    long_cut = "Wash the pan with warm water and soap. Dry it well before you store it. Then"
    fake = FakeBase({train[0]["messages"][-2]["content"]: Reply(long_cut, finished=False)})
    replies = {prompt_key(r): r["messages"][-1]["content"] for r in derive(source, fake).records("train")}
    assert replies[prompt_key(train[0])] == "Wash the pan with warm water and soap. Dry it well before you store it."
    info = derive(source, fake).manifest["self_replies"]
    assert info["replaced"]["trimmed_to_last_sentence"] == 1 and info["kept"]["total"] == 0
    dropped = derive(source, fake, cfg=CFG.model_copy(update={"cut_replies": "drop"})).manifest["self_replies"]
    assert dropped["kept"]["by_reason"] == {"truncated": 1} and dropped["replaced"]["trimmed_to_last_sentence"] == 0


def test_the_same_inputs_find_the_derived_snapshot_without_an_engine(source: Snapshot) -> None:
    first = derive(source, FakeBase())
    again = derive(source)  # no_engine: starting one fails the test
    assert again.hash == first.hash
    assert derive(first).hash == first.hash  # a derived snapshot as the source: derived from its own source
    assert len(list_snapshots(source.path.parent)) == 2


def test_settings_that_make_the_same_records_find_that_snapshot_too(source: Snapshot) -> None:
    """A higher max_tokens where no reply was cut: the same records, so the same snapshot, found by either key."""
    first = derive(source, FakeBase())
    longer = CFG.model_copy(update={"max_tokens": 64})
    assert derive(source, FakeBase(), cfg=longer).hash == first.hash
    assert derive(source, cfg=longer).hash == derive(source).hash == first.hash  # no engine either time
    assert first.manifest["self_replies"]["generation"]["max_tokens"] == CFG.max_tokens  # the first key's manifest


def test_a_deleted_derived_snapshot_is_derived_again(source: Snapshot) -> None:
    first = derive(source, FakeBase())
    first.path.chmod(0o700)
    for f in first.path.iterdir():
        f.chmod(0o600)
        f.unlink()
    first.path.rmdir()
    again = FakeBase()
    assert derive(source, again).hash == first.hash and again.asked


def test_another_base_or_setting_derives_anew(source: Snapshot) -> None:
    first = derive(source, FakeBase())
    other_base = FakeBase()
    derive(source, other_base, base_hash="c" * 64)
    assert other_base.asked  # not found: generated again
    other_dtype = FakeBase()
    derive(source, other_dtype, dtype="bfloat16")
    assert other_dtype.asked
    keys = {
        derivation_key(source.hash, "b" * 64, settings(CFG, "float32")),
        derivation_key(source.hash, "c" * 64, settings(CFG, "float32")),
        derivation_key(source.hash, "b" * 64, settings(CFG, "bfloat16")),
        derivation_key(source.hash, "b" * 64, settings(CFG.model_copy(update={"max_tokens": 33}), "float32")),
        derivation_key("0" * 64, "b" * 64, settings(CFG, "float32")),
    }
    assert len(keys) == 5 and first.manifest["self_replies"]["key"] in keys


def test_max_records_caps_the_replaced_records_train_first(source: Snapshot) -> None:
    typed = {s: [stored_record(r) for r in source.records(s)] for s in SPLITS}
    every = choose(typed, CFG)
    assert {t.split for t in every} == {"train", "validation"}
    assert all(typed[t.split][t.index].metadata["skill"] in CFG.skills for t in every)
    assert len(every) == sum(
        1 for s in ("train", "validation") for r in typed[s] if r.metadata["skill"] in ("formatting", "borderline")
    )
    capped = choose(typed, CFG.model_copy(update={"max_records": 3}))
    assert capped == every[:3] and {t.split for t in capped} == {"train"}


def test_no_listed_record_returns_the_source_without_an_engine(source: Snapshot) -> None:
    assert derive(source, cfg=CFG.model_copy(update={"skills": ["facts"]})).hash == source.hash


def test_an_unknown_derived_from_is_an_error(tmp_path: Path, source: Snapshot) -> None:
    fake = Snapshot(source.hash, source.path, {**source.manifest, "derived_from": "f" * 64})
    with pytest.raises(NotFoundError):
        derive(fake)


def test_the_train_key_is_the_derived_snapshots_not_the_stage_settings(source: Snapshot, tmp_path: Path) -> None:
    """The settings shaped the snapshot whose hash the key holds: a config without the stage keeps its run's key."""
    base = ModelFolder(tmp_path, {"weights_hash": "b" * 64})
    off, on = FinetuneConfig(), FinetuneConfig(self_replies=CFG)
    derived = derive(source, FakeBase())
    assert train_key(off, source, base) == train_key(on, source, base) != train_key(on, derived, base)


def test_the_stage_config_names_generator_skills_and_is_off_for_the_preference_stage() -> None:
    assert not FinetuneConfig().self_replies.enabled
    with pytest.raises(ValidationError, match="skills"):
        SelfRepliesConfig.model_validate({"skills": ["poetry"]})
    with pytest.raises(ValidationError, match="self_replies must be off"):
        PreferenceConfig(train=FinetuneConfig(self_replies=CFG))


def test_a_base_only_record_trains_on_the_base_reply_or_not_at_all(tmp_path: Path) -> None:
    """A prompt without a generated answer (metadata reply: base) never keeps its placeholder: the base's reply
    replaces it, or the record is dropped (a refused prompt, the test split, past max_records), and counted."""
    rows = records() + [
        chat(f"How do I shoot photo {i} at night?", "(placeholder)", skill="borderline_varied", reply="base")
        for i in range(30)
    ]
    src = build_snapshot(
        LIMITS,
        [write_jsonl(tmp_path / "data.jsonl", rows)],
        tmp_path / "snapshots",
        reports=tmp_path / "reports",
    )
    marked = {s: [r for r in src.records(s) if r["metadata"].get("reply") == "base"] for s in SPLITS}
    assert all(marked.values())  # every split holds some
    refused = marked["train"][0]["messages"][-2]["content"]
    assert "borderline_varied" not in CFG.skills  # selected for its mark, whatever the skills list
    derived = derive(src, FakeBase({refused: Reply("I'm sorry, but I can't help with that.")}))
    kept = [r for s in SPLITS for r in derived.records(s) if r["metadata"].get("reply") == "base"]
    assert kept and all(r["messages"][-1]["content"].startswith("base says: ") for r in kept)
    assert not any(r["messages"][-2]["content"] == refused for s in SPLITS for r in derived.records(s))
    assert all(r["metadata"].get("reply") != "base" for r in derived.records("test"))
    dropped = derived.manifest["self_replies"]["dropped_base_only"]
    assert dropped == {"total": 1 + len(marked["test"]), "by_split": {"train": 1, "test": len(marked["test"])}}
    assert derived.manifest["counts"] == {s: len(list(derived.records(s))) for s in SPLITS}
    assert derived.manifest["skills"]["train"]["borderline_varied"] == len(marked["train"]) - 1
    # the unmarked records are untouched: the test split's others stay byte for byte
    unmarked_test = [r for r in src.records("test") if r["metadata"].get("reply") != "base"]
    assert sorted(map(str, derived.records("test"))) == sorted(map(str, unmarked_test))
