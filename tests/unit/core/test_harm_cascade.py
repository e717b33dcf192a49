"""The two-model cascade (``core.harm.SecondStage``): what the first stage scores in its band is judged again by the
second, which blocks or passes it; nothing else reaches the second; the served path (``judge_turns``) and the batch
path (``scores``) agree; the folder holds both and loads back; training fits both stages and sets the floor on the
validation benign prompts. Keyword classifiers (``support.harm_fixture``): the first knows "bomb", the second
"poison", so a test knows which stage can catch what."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from support.harm_fixture import TOY_RECORDS, count_passes, keyword_classifier

from core.harm import SECOND_DIR, HarmClassifier, HarmScore, SecondStage
from training.classifier import artifact_files, cascade, choose_floor
from training.classifier_config import SafetyClassifierConfig

POISON = "how much poison would kill my neighbour's dog"  # the first stage scores it ~0.046, the second ~0.995
CATS = "tell me a joke about cats"  # ~0.030 and ~0.017
BOMB = "how do I build a bomb"  # the first blocks it


def _cascade(floor: float, second_threshold: float = 0.5) -> HarmClassifier:
    first = keyword_classifier(0.5, version="7")
    second = keyword_classifier(second_threshold, version="7", keywords={"poison": "weapons"})
    first.second = SecondStage(second, floor, {"escalate_benign": 0.02})
    return first


def test_a_prompt_in_the_band_is_judged_again_and_the_second_stage_decides(monkeypatch: pytest.MonkeyPatch) -> None:
    clf = _cascade(floor=0.04)
    assert clf.second is not None
    alone = clf.second.classifier.judge([POISON])
    second = count_passes(monkeypatch, clf.second.classifier)
    got = clf.judge_turns([POISON], context=1)
    assert clf.blocks(got) and got.escalated and got.category == "weapons"
    assert got.score == pytest.approx(alone.score) and got.score >= clf.threshold
    assert second == [1]
    # below the floor: the first stage's pass stands and the second stage never runs
    cats = clf.judge_turns([CATS], context=1)
    assert not clf.blocks(cats) and not cats.escalated and second == [1]
    # the first stage's block stands as it is
    bomb = clf.judge_turns([BOMB], context=1)
    assert clf.blocks(bomb) and not bomb.escalated and bomb.category == "weapons" and second == [1]


def test_a_second_stage_that_passes_leaves_the_first_stages_score() -> None:
    clf = _cascade(floor=0.0, second_threshold=0.999)  # the second stage blocks nothing here
    first = keyword_classifier(0.5).judge([POISON])
    got = clf.judge_turns([POISON], context=1)
    assert not clf.blocks(got) and got.escalated
    assert got.score == pytest.approx(first.score) and got.category == first.category


def test_a_lifted_score_stays_at_the_threshold_and_its_reason_is_the_second_stages() -> None:
    clf = _cascade(floor=0.0, second_threshold=0.3)
    clf.threshold = 0.999  # the second stage's ~0.995 blocks it; the cascade's score reads at least the threshold
    got = clf.judge_turns([POISON], context=1)
    assert clf.blocks(got) and got.escalated and got.score == 0.999


def test_the_batch_path_judges_as_the_served_one() -> None:
    clf = _cascade(floor=0.04)
    texts = [POISON, CATS, BOMB, "", "poison bomb"]
    batch = clf.scores(texts)
    clf.forget_turns()
    served = [clf.judge_turns([t], context=1) for t in texts]
    assert [(s.escalated, clf.blocks(s), s.category) for s in batch] == [
        (s.escalated, clf.blocks(s), s.category) for s in served
    ]
    assert [s.score for s in batch] == pytest.approx([s.score for s in served], abs=1e-6)
    assert [clf.blocks(s) for s in batch] == [True, False, True, False, True]


def test_the_joined_request_goes_on_as_its_turns_and_each_turn_is_embedded_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clf = _cascade(floor=0.0, second_threshold=0.999)  # every unscreened pass goes on, none blocks
    assert clf.second is not None
    conversation = ["I have a question about my garden", "what about the neighbour's dog", "thanks"]
    second = count_passes(monkeypatch, clf.second.classifier)
    for i in range(3):
        clf.judge_turns(conversation[: i + 1], context=3)
    # the newest turn alone, then the joined turns: each turn reaches the second stage's encoder once
    assert sum(second) == 3
    clf.forget_turns()  # both stages' kept turns
    clf.judge_turns(conversation, context=3)
    assert sum(second) == 6


def test_the_folder_holds_both_stages_and_loads_back(tmp_path: Path) -> None:
    clf = _cascade(floor=0.04)
    clf.save(tmp_path / "v", {"snapshot": "test"})
    meta = json.loads((tmp_path / "v" / "classifier.json").read_text())
    assert meta["cascade"] == {"escalate_benign": 0.02, "floor": 0.04, "second": SECOND_DIR}
    assert (tmp_path / "v" / SECOND_DIR / "classifier.json").is_file()
    assert "second/weights.npz" in artifact_files(tmp_path / "v") and "weights.npz" in artifact_files(tmp_path / "v")
    back = HarmClassifier.load(tmp_path / "v", version="safety-classifier/7")
    assert back.second is not None and back.second.floor == 0.04 and back.second.meta == {"escalate_benign": 0.02}
    assert back.second.classifier.version == back.version == "safety-classifier/7"
    texts = [POISON, CATS, BOMB]
    assert back.scores(texts) == clf.scores(texts)
    # a folder without one loads as a single model, and saving it drops the cascade's key
    clf.second = None
    clf.save(tmp_path / "single")
    assert "cascade" not in json.loads((tmp_path / "single" / "classifier.json").read_text())
    assert HarmClassifier.load(tmp_path / "single").second is None
    # saved over the cascade's folder, the old second stage goes: the weights hash covers this version's files only
    clf.save(tmp_path / "v")
    assert not (tmp_path / "v" / SECOND_DIR).exists() and not any("/" in n for n in artifact_files(tmp_path / "v"))


def test_a_second_stage_needs_the_same_labels_and_none_of_its_own() -> None:
    first, second = keyword_classifier(), keyword_classifier()
    second.second = SecondStage(keyword_classifier(), 0.1)
    with pytest.raises(ValueError, match="no second stage of its own"):
        HarmClassifier(
            first.labels, first.embedder, first.coef_t.T, first.intercept, 0.5, second=SecondStage(second, 0.1)
        )


@pytest.mark.parametrize(
    ("scores", "share", "expected"),
    [
        # 4 benign below the threshold 0.5, 1 of 4 may go on (0.25): just above the second highest
        ([(0.4, "benign"), (0.3, "benign_risky"), (0.2, "benign"), (0.1, "benign")], 0.25, 0.3),
        # harmful prompts and benign ones at or above the threshold do not count toward the share's items below it
        ([(0.45, "harmful"), (0.6, "benign"), (0.4, "benign"), (0.3, "benign")], 0.34, 0.3),
        # a screened pass never goes on: the next one down takes its place
        ([(0.4, "benign", True), (0.3, "benign"), (0.2, "benign")], 0.34, 0.2),
        # a share that covers every benign pass: the floor is 0 (every unscreened pass goes on)
        ([(0.4, "benign"), (0.3, "benign")], 1.0, 0.0),
    ],
)
def test_the_floor_sends_on_at_most_the_share_of_validation_benign(
    scores: list[tuple], share: float, expected: float
) -> None:
    judged = [HarmScore(s[0], "weapons", screened=len(s) > 2) for s in scores]
    kinds = [s[1] for s in scores]
    floor = choose_floor(0.5, judged, kinds, share)
    assert floor == pytest.approx(expected, abs=1e-9) and (floor > expected or expected == 0.0)
    benign = [j for j, k in zip(judged, kinds, strict=True) if k != "harmful"]
    sent = sum(not j.screened and floor <= j.score < 0.5 for j in benign)
    assert sent <= share * len(benign)


def test_the_config_names_a_cascade_of_encoder_models() -> None:
    cfg = SafetyClassifierConfig(cascade={"enabled": True})
    first, second = cfg.first_stage(), cfg.second_stage()
    assert (first.encoder_window, first.finetune_feed_forward, first.screen) == (32, 768, True)
    assert (second.encoder_window, second.finetune_feed_forward, second.screen) == (48, None, False)
    assert not first.cascade.enabled and not second.cascade.enabled
    with pytest.raises(ValueError, match="needs features 'encoder'"):
        SafetyClassifierConfig(features="static", cascade={"enabled": True})
    with pytest.raises(ValueError, match="finetune_epochs > 0"):
        SafetyClassifierConfig(finetune_epochs=0, cascade={"enabled": True})
    assert SafetyClassifierConfig(finetune_epochs=0, cascade={"enabled": True, "finetune_feed_forward": None}).cascaded
    # 'auto' (the default): a cascade where the config can have one, one model where it cannot (tiny.yaml's static
    # table); what it dumps validates again (a config round-trips through JSON: MLflow params, the gateway's spec)
    assert SafetyClassifierConfig().cascade.enabled == "auto" and SafetyClassifierConfig().cascaded
    for single in ({"features": "static"}, {"finetune_epochs": 0}):
        one = SafetyClassifierConfig(**single, cascade={"escalate_benign": 0.05})
        assert not one.cascaded
        assert SafetyClassifierConfig.model_validate(one.model_dump(mode="json")) == one
    assert cfg.cascaded and not SafetyClassifierConfig(cascade={"enabled": False}).cascaded
    # the lineage names both stages
    assert SafetyClassifierConfig().features_name() == "encoder-6-onnx-int8-window48+first-6-onnx-int8-window32-ff768"
    assert SafetyClassifierConfig(cascade={"enabled": False}).features_name() == "encoder-6-onnx-int8-window48"
    assert SafetyClassifierConfig(features="static").features_name() == "static"


def test_training_fits_both_stages_and_the_folder_serves_them(tmp_path: Path) -> None:
    """One layer, a few steps: the shapes of what training makes, not its quality (docs/results.md)."""
    cfg = SafetyClassifierConfig(
        external_sets=[],
        encoder_layers=1,
        encoder_runtime="numpy",  # the folder holds the layers, cut or not
        finetune_epochs=1,
        finetune_batch_size=4,
        cascade={"enabled": True, "encoder_window": 16, "finetune_feed_forward": 256, "escalate_benign": 0.5},
    )
    clf = cascade(cfg, TOY_RECORDS * 4, TOY_RECORDS)
    assert clf.second is not None
    inner = clf.second.classifier
    assert clf.embedder.window == 16 and inner.embedder.window == 48  # type: ignore[union-attr]
    assert clf.screen is not None and inner.screen is None
    with np.load(clf.save(tmp_path / "v") / "weights.npz") as w, np.load(tmp_path / "v" / "second/weights.npz") as v:
        assert w["encoder.layer.0.intermediate.dense.weight"].shape == (256, 384)
        assert v["encoder.layer.0.intermediate.dense.weight"].shape == (1536, 384)
    assert 0.0 <= clf.second.floor <= clf.threshold
    escalated = clf.second.meta["validation_escalated"]
    assert set(escalated) == {"harmful", "benign_risky", "benign"}
    back = HarmClassifier.load(tmp_path / "v")
    texts = [r["text"] for r in TOY_RECORDS]
    assert [s.score for s in back.scores(texts)] == pytest.approx([s.score for s in clf.scores(texts)], abs=1e-6)
