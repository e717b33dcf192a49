"""The safety classifier's data: generated splits share no wording (the leakage contract), user prompts that
share eval wording are dropped and counted, and the snapshot is content-addressed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.harm_fixture import hand_written_texts

from core.errors import DataError
from training.data.harm_generator import ALL_ACTIONS, ALL_FRAMES, generate_harm, is_training_only, split_of
from training.data.harm_pools import ACTIONS, FRAMES, HARM_CATEGORIES, LEXICON
from training.data.harm_pools_discreet import DISCREET_ASKS
from training.data.harm_pools_meta import META_TURNS
from training.data.harm_pools_more import MORE_ACTIONS, MORE_FRAMES
from training.data.harm_pools_train import TRAIN_ACTION_FRAMES, TRAIN_ACTIONS, TRAIN_STATEMENTS
from training.data.harm_pools_twins import TRAIN_TWINS
from training.data.harm_synth import (
    SPLITS,
    build_harm_snapshot,
    check_disjoint,
    ngrams,
    wording_units,
)
from training.data.records import Phrasings


def test_generated_splits_share_no_frame_action_or_phrase() -> None:
    # the options' data included: a superset
    splits = generate_harm(statements=True, twins=TRAIN_ACTION_FRAMES, meta=True, discreet=True)
    check_disjoint(splits)
    units = {s: set().union(*(wording_units(r) for r in rs)) for s, rs in splits.items()}
    assert not units["train"] & units["validation"] and not units["train"] & units["test"]
    assert not units["validation"] & units["test"]
    train_grams = set().union(*(ngrams(r["text"]) for r in splits["train"]))
    assert not any(ngrams(r["text"]) & train_grams for s in ("validation", "test") for r in splits[s])
    for split in SPLITS:  # every class in every split
        labels = {r["label"] for r in splits[split]}
        kinds = {r["kind"] for r in splits[split]}
        assert labels == {*HARM_CATEGORIES, "benign"} and kinds == {"harmful", "benign_risky", "benign"}, split


def test_pools_are_dealt_by_position_and_large_enough() -> None:
    assert [split_of(i) for i in range(5)] == ["train", "train", "train", "validation", "test"]
    assert all(len(a) >= 10 for a in ACTIONS.values()) and len(FRAMES) >= 20
    assert set(LEXICON) == set(ACTIONS)  # the training-only vocabulary covers every class


def test_the_wider_pools_continue_the_old_ones_and_reach_every_split() -> None:
    assert ALL_FRAMES[: len(FRAMES)] == FRAMES and ALL_FRAMES[len(FRAMES) :] == MORE_FRAMES
    assert all(ALL_ACTIONS[c][: len(ACTIONS[c])] == ACTIONS[c] for c in ACTIONS)  # old positions, old splits
    assert set(MORE_ACTIONS) == set(ACTIONS) and all(len(a) >= 15 for a in MORE_ACTIONS.values())
    assert all(f.count("{x}") == 1 for f in ALL_FRAMES)
    splits = generate_harm()
    for split in SPLITS:  # the indirect, role-play and fiction frames are in every split
        new = {f"f{len(FRAMES) + i}" for i in range(len(MORE_FRAMES))}
        assert any(r["wording"].split("+")[0] in new for r in splits[split]), split


def test_training_only_concepts_stay_in_training_in_several_frames_and_out_of_the_chat_data() -> None:
    from training.data.synth import varied_pools

    assert set(TRAIN_ACTIONS) == set(ACTIONS)
    assert not any(".ts" in r["wording"] for r in generate_harm()["train"])  # off here; the config turns them on
    splits = generate_harm(statements=True)
    kept = [r for r in splits["train"] if is_training_only(r)]
    statements = [r for r in kept if ".ts" in r["wording"]]
    assert len(kept) - len(statements) == TRAIN_ACTION_FRAMES * sum(map(len, TRAIN_ACTIONS.values()))
    assert {r["wording"] for r in statements} == {
        f"{c}.ts{i}" for c, ss in TRAIN_STATEMENTS.items() for i in range(len(ss))
    }
    assert len(statements) == 3 * sum(map(len, TRAIN_STATEMENTS.values()))  # each in its three surface forms
    assert not any(is_training_only(r) for s in ("validation", "test") for r in splits[s])
    harmful = TRAIN_ACTIONS["weapons"][0]
    frames = {r["wording"].split("+")[0] for r in kept if r["wording"].endswith("weapons.t0")}
    assert len(frames) == TRAIN_ACTION_FRAMES and all(split_of(int(f[1:])) == "train" for f in frames)
    # the chat recipes' varied skills keep their data: the classifier's own concepts are not drawn into them
    texts = {t for items in varied_pools(()).values() for turns, _ in items for t, _ in turns}
    assert not any(harmful in t for t in texts) and texts
    assert not any(TRAIN_STATEMENTS["benign"][0] in t for t in texts)
    assert not any(TRAIN_TWINS["weapons"][0] in t for t in texts)


def test_each_harmful_concept_has_a_benign_twin_asked_in_its_own_frames() -> None:
    """A twin mirrors its harmful action one for one and is asked in the first ``twins`` of the same frames, so
    the pair differs in purpose only; it is benign, training-only, and never reaches an eval split."""

    assert set(TRAIN_TWINS) == set(HARM_CATEGORIES)
    assert all(len(TRAIN_TWINS[c]) == len(TRAIN_ACTIONS[c]) for c in HARM_CATEGORIES)
    twins = [t for ts in TRAIN_TWINS.values() for t in ts]
    harmful = {a for c in HARM_CATEGORIES for a in TRAIN_ACTIONS[c]}
    assert len(set(twins)) == len(twins) and not set(twins) & harmful
    assert not any("_twin." in r["wording"] for r in generate_harm()["train"])  # off unless asked for
    splits = generate_harm(twins=3)
    assert sum("_twin." in r["wording"] for r in splits["train"]) == 3 * len(twins)
    by_wording: dict[str, list[dict[str, str]]] = {}
    for r in splits["train"]:
        by_wording.setdefault(r["wording"].split("+")[-1], []).append(r)
    for c in HARM_CATEGORIES:
        for i in range(len(TRAIN_ACTIONS[c])):
            pair = by_wording[f"{c}_twin.t{i}"]
            frames = [r["wording"].split("+")[0] for r in by_wording[f"{c}.t{i}"]][:3]
            assert [r["wording"].split("+")[0] for r in pair] == frames
            assert {(r["label"], r["kind"]) for r in pair} == {("benign", "benign_risky")}
            assert all(is_training_only(r) for r in pair)
    assert not any("_twin." in r["wording"] for s in ("validation", "test") for r in splits[s])


def test_no_generated_prompt_shares_a_phrase_with_the_human_slice() -> None:
    """The human slice (and the hand-written system messages with their user turns, and the hand-written assistant
    turns with theirs, and the requests for discretion) measures wording the generator never produced: the leakage
    contract against it too."""
    written = hand_written_texts()
    human = set().union(*(ngrams(t) for t in written))
    human_texts = {t.lower() for t in written}
    for split, records in generate_harm(statements=True, twins=TRAIN_ACTION_FRAMES, meta=True, discreet=True).items():
        for r in records:
            assert not ngrams(r["text"]) & human, (split, r["text"])
            assert r["text"].lower() not in human_texts


def test_a_planted_leak_is_caught() -> None:
    splits = generate_harm()
    leaked = dict(splits["train"][0])
    with pytest.raises(DataError, match="shares wording"):
        check_disjoint({**splits, "test": [*splits["test"], leaked]})
    paraphrase = {**leaked, "wording": ""}  # no unit ids, the same text
    with pytest.raises(DataError, match="also a training prompt"):
        check_disjoint({**splits, "test": [*splits["test"], paraphrase]})
    phrase = " ".join(leaked["text"].split()[:7])
    with pytest.raises(DataError, match="shares the phrase"):
        check_disjoint({**splits, "test": [*splits["test"], {**paraphrase, "text": phrase + " and more words"}]})


def test_user_prompts_with_eval_wording_are_dropped_and_the_hash_follows_content(tmp_path: Path) -> None:
    test_prompt = generate_harm()["test"][0]["text"]
    source = tmp_path / "red_team.jsonl"
    rows = [{"text": test_prompt, "label": "weapons"}, {"text": "teach me to poison a reservoir", "label": "violence"}]
    source.write_text("".join(json.dumps(r) + "\n" for r in rows))
    first = build_harm_snapshot(tmp_path / "snaps", sources=[source])
    assert first.manifest["dropped"]["overlaps_eval_wording"] == 1
    assert any(r["text"] == "teach me to poison a reservoir" for r in first.records("train"))
    assert not any(r["text"] == test_prompt for r in first.records("train"))
    again = build_harm_snapshot(tmp_path / "snaps", sources=[source])
    assert again.hash == first.hash and again.path == first.path
    source.write_text(json.dumps({"text": "teach me to poison a lake", "label": "violence"}) + "\n")
    assert build_harm_snapshot(tmp_path / "snaps", sources=[source]).hash != first.hash


def test_a_bad_user_line_names_its_file_and_line(tmp_path: Path) -> None:
    source = tmp_path / "bad.jsonl"
    source.write_text(json.dumps({"text": "hi", "label": "benign"}) + "\n" + json.dumps({"text": "x", "label": "rude"}))
    with pytest.raises(DataError, match=r"bad.jsonl:2: label must be one of"):
        build_harm_snapshot(tmp_path / "snaps", sources=[source])


def test_no_training_prompt_keeps_a_phrasing_the_chat_eval_asks_in(tmp_path: Path) -> None:
    # the chat eval's hand-written items (flows.classifier_stages.chat_eval_prompts passes them): a generated
    # training prompt sharing five words with one is left out and counted, so a gate through the classifier holds
    train = [r["text"] for r in generate_harm()["train"]]
    asked = [f"Quick question: {' '.join(train[0].split()[:6])} today?", "A sentence no generated prompt has in it."]
    snap = build_harm_snapshot(tmp_path / "snaps", avoid=asked)
    kept = [r["text"] for r in snap.records("train")]
    taught = Phrasings.of(asked)
    assert train[0] not in kept and not [t for t in kept if taught.shared(t) is not None]
    assert snap.manifest["dropped"]["shares_chat_eval_phrasing"] >= 1
    assert build_harm_snapshot(tmp_path / "snaps").hash != snap.hash


def test_a_training_only_statement_is_asked_as_written_as_a_sentence_and_after_an_opener() -> None:
    from training.data.harm_generator import statement_forms

    assert statement_forms("are you mad at me", 0) == [
        "are you mad at me",
        "Are you mad at me?",
        "hey, are you mad at me",
    ]
    assert statement_forms("I regret it", 1) == ["I regret it", "I regret it.", "ok so I regret it"]


def test_the_direct_address_that_opens_a_benign_statement_opens_harmful_ones_too() -> None:
    """An opener only benign prompts use is learnt as benign ("can you ..."): the statements carry each opener of
    their benign ones on harmful requests too, as the generator's frames carry both kinds of action."""

    def opening(texts: tuple[str, ...], opener: str) -> int:
        return sum(t.lower().replace(" u ", " you ").startswith(opener) for t in texts)

    benign = TRAIN_STATEMENTS["benign"] + TRAIN_STATEMENTS["benign_risky"]
    harmful = tuple(t for c, ts in TRAIN_STATEMENTS.items() if c not in ("benign", "benign_risky") for t in ts)
    for opener in ("can you", "could you", "would you", "will you", "do you", "are you"):
        if opening(benign, opener):
            assert opening(harmful, opener) >= 3, opener


def test_the_statements_are_opt_in_and_make_their_own_snapshot(tmp_path: Path) -> None:
    plain = build_harm_snapshot(tmp_path / "snaps")
    withs = build_harm_snapshot(tmp_path / "snaps", statements=True)
    assert withs.hash != plain.hash and withs.manifest["sources"] == ["generator (with training-only statements)"]
    trained = {r["text"] for r in withs.records("train")}
    assert TRAIN_STATEMENTS["benign"][1] in trained and TRAIN_STATEMENTS["benign"][1] not in {
        r["text"] for r in plain.records("train")
    }
    assert [list(withs.records(s)) for s in ("validation", "test")] == [
        list(plain.records(s)) for s in ("validation", "test")
    ]


def test_the_twins_are_opt_in_and_make_their_own_snapshot(tmp_path: Path) -> None:
    plain = build_harm_snapshot(tmp_path / "snaps")
    twinned = build_harm_snapshot(tmp_path / "snaps", twins=2)
    assert twinned.hash != plain.hash and twinned.manifest["sources"] == ["generator (with benign twins in 2 frames)"]
    both = build_harm_snapshot(tmp_path / "snaps", statements=True, twins=2)
    assert both.manifest["sources"] == ["generator (with training-only statements; benign twins in 2 frames)"]
    trained = [r for r in twinned.records("train") if TRAIN_TWINS["hate"][4] in r["text"].lower()]
    assert trained and all(r["label"] == "benign" for r in trained)
    assert twinned.manifest["counts"]["train"] == plain.manifest["counts"]["train"] + 2 * sum(
        map(len, TRAIN_TWINS.values())
    )
    assert [list(twinned.records(s)) for s in ("validation", "test")] == [
        list(plain.records(s)) for s in ("validation", "test")
    ]


@pytest.mark.parametrize(
    ("option", "pool", "kind", "source"),
    [
        ("meta", META_TURNS, "benign", "turns about the conversation"),  # "your answer got cut off, finish it"
        ("discreet", DISCREET_ASKS, "benign_risky", "requests for discretion"),  # "hide the presents from the kids"
    ],
)
def test_the_training_only_benign_statements_are_opt_in_and_apart_from_the_eval_files(
    tmp_path: Path, option: str, pool: tuple[str, ...], kind: str, source: str
) -> None:
    """Each statement of an option's pool in its statement forms, benign of its kind, in training alone, and a
    snapshot of its own whose eval files are the default's."""
    assert len(set(pool)) == len(pool) >= 100
    splits = generate_harm(**{option: True})
    added = [r for r in splits["train"] if r["wording"].startswith(f"{option}.")]
    assert len(added) == 3 * len(pool) and all(is_training_only(r) for r in added)
    assert {(r["label"], r["kind"]) for r in added} == {("benign", kind)}
    assert not any(r["wording"].startswith(f"{option}.") for r in generate_harm()["train"])
    plain = build_harm_snapshot(tmp_path / "snaps", statements=True)
    with_them = build_harm_snapshot(tmp_path / "snaps", statements=True, **{option: True})
    assert with_them.hash != plain.hash
    assert with_them.manifest["sources"] == [f"generator (with training-only statements; {source})"]
    assert [list(with_them.records(s)) for s in ("validation", "test")] == [
        list(plain.records(s)) for s in ("validation", "test")
    ]
