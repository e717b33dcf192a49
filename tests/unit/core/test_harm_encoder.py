"""The harm classifier's ``encoder`` features: the NumPy MiniLM layers (``core.minilm``) compute what ``transformers``'
BertModel computes with its first K layers, a folder of the new format loads back to the same scores, ``judge_turns``
keeps its contract (newest turn alone and the newest ``context`` joined, the more harmful), and training embeds with
exactly the weights the folder serves. A handful of texts each: seconds, most of it loading torch's model once."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

import numpy as np
import pytest
from support.harm_fixture import TEXTS, TOY_RECORDS, count_passes

from core.harm import ENCODER_FORMAT, ENCODER_MAX_TOKENS, EncoderEmbedder, HarmClassifier, HarmScore, Screen
from core.minilm import MiniLmEncoder, unit_rows
from core.minilm_onnx import OnnxMiniLm
from training.classifier import encoder_weights, fit, fit_screen, minilm_folder
from training.classifier_config import SafetyClassifierConfig
from training.data.harm_synth import LABELS


@cache
def _embedder(layers: int = 2) -> EncoderEmbedder:
    tokenizer_json, weights, cls_sep = encoder_weights(layers)
    return EncoderEmbedder(tokenizer_json, weights, layers, cls_sep)


@pytest.mark.parametrize("layers", [1, 2])
def test_numpy_layers_match_torch_bert(layers: int) -> None:
    torch = pytest.importorskip("torch")
    from safetensors.numpy import load_file
    from transformers import AutoTokenizer, BertModel

    folder = minilm_folder()
    ours = MiniLmEncoder(load_file(str(folder / "model.safetensors")), layers)
    tok = AutoTokenizer.from_pretrained(str(folder))
    model = BertModel.from_pretrained(str(folder)).eval()
    model.encoder.layer = model.encoder.layer[:layers]
    for text in TEXTS:
        ids = tok(text, truncation=True, max_length=256)["input_ids"]
        with torch.inference_mode():
            hidden = model(input_ids=torch.tensor([ids])).last_hidden_state[0].numpy()
        pooled = hidden.mean(axis=0) / np.linalg.norm(hidden.mean(axis=0))
        np.testing.assert_allclose(ours.hidden(np.array(ids)), hidden, atol=1e-4)
        np.testing.assert_allclose(ours.encode(np.array(ids)), pooled, atol=1e-4)


def test_embedder_adds_cls_and_sep_as_minilms_tokenizer_does() -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(minilm_folder()))
    e = _embedder()
    for text in TEXTS:
        direct = e.encoder.encode(np.array(tok(text)["input_ids"]))
        np.testing.assert_allclose(e.embed([text])[0], direct, atol=1e-6)


def test_a_long_turn_is_judged_by_its_head_and_tail() -> None:
    e = _embedder()
    ids = e.ids("filler words here " * 200 + "how do I build a pipe bomb")
    keep = ENCODER_MAX_TOKENS - 2  # with [CLS] and [SEP]
    kept = e.head_and_tail(ids, keep)
    assert len(ids) > keep and len(kept) == keep
    assert list(kept[-4:]) == list(ids[-4:]) and list(kept[:4]) == list(ids[:4])
    # the pooled vector is the kept tokens' (the middle costs nothing on the request path)
    np.testing.assert_allclose(e.pool(ids), e.pool(kept), atol=1e-6)


def test_a_window_is_what_the_screen_and_the_encoder_both_read(tmp_path: Path) -> None:
    tokenizer_json, weights, cls_sep = encoder_weights(2)
    e = EncoderEmbedder(tokenizer_json, weights, 2, cls_sep, window=16)
    long_turn = "filler words here " * 40 + "how do I build a pipe bomb"
    whole = _embedder().ids(long_turn)
    ids = e.ids(long_turn)
    assert len(ids) == 14 and list(ids) == list(e.head_and_tail(whole, 14))  # 16 with [CLS] and [SEP]
    assert len(e.framed(ids)) == 16
    short = "how do I build a pipe bomb"
    assert list(e.ids(short)) == list(_embedder().ids(short))  # a turn that fits reads as without a window
    np.testing.assert_allclose(e.embed([short]), _embedder().embed([short]), atol=1e-6)
    # the screen's features are the window's words, not the pasted document's
    np.testing.assert_allclose(e.word_sums([e.ids(long_turn)]), e.word_sums([ids]), atol=1e-6)
    # a version records its window, and one without it loads as before (no window: every token for the screen)
    coef = np.zeros((len(LABELS), 384))
    HarmClassifier(LABELS, e, coef, np.zeros(len(LABELS)), 0.5).save(tmp_path / "w")
    assert json.loads((tmp_path / "w" / "classifier.json").read_text())["encoder_window"] == 16
    assert HarmClassifier.load(tmp_path / "w").embedder.window == 16  # type: ignore[union-attr]
    HarmClassifier(LABELS, _embedder(), coef, np.zeros(len(LABELS)), 0.5).save(tmp_path / "none")
    assert "encoder_window" not in json.loads((tmp_path / "none" / "classifier.json").read_text())
    assert HarmClassifier.load(tmp_path / "none").embedder.window is None  # type: ignore[union-attr]
    with pytest.raises(ValueError, match="between 8 and 128"):
        EncoderEmbedder(tokenizer_json, weights, 2, cls_sep, window=4)


def _toy_classifier(threshold: float = 0.5) -> HarmClassifier:
    """Weapons leans toward the embedding of a bomb question, benign carries the intercept."""
    e = _embedder()
    coef = np.zeros((len(LABELS), 384))
    coef[LABELS.index("weapons")] = 60 * e.embed(["how do I build a pipe bomb"])[0]
    intercept = np.zeros(len(LABELS))
    intercept[LABELS.index("benign")] = 50.0
    return HarmClassifier(LABELS, e, coef, intercept, threshold)


@pytest.mark.parametrize("window", [16, 48])
def test_a_windowed_long_turn_tokenizes_its_ends_alone_to_the_same_ids(
    window: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``ids`` of a windowed embedder reads a long turn's two ends only (a fifth of tokenizing a pasted document
    whole): the ids are those of the whole text's head and tail, whatever the text (long words, no spaces,
    punctuation runs, accents and CJK the normalizer rewrites, control and zero-width characters, > 4096 chars)."""
    import random

    from core.harm_embed import _WordPieces

    tokenizer_json, weights, cls_sep = encoder_weights(1)
    e = EncoderEmbedder(tokenizer_json, weights, 1, cls_sep, window=window)

    def whole(text: str) -> list[int]:  # the text as read, tokenized whole (no ends-only shortcut)
        return list(e.head_and_tail(_WordPieces._ids(e, e.read(text)), window - 2))

    rng = random.Random(window)
    pieces = list("abcdefgh KLMN,.;!?-'\"\t\n  ") + ["é", "ß", "中", "文", "😀", "\u0301", "\u200b", "\x00", "ﬁ"]
    texts = [t * k for t in TEXTS for k in (1, 20, 300)]
    texts += ["".join(rng.choice(pieces) for _ in range(rng.choice([40, 400, 3000, 9000]))) for _ in range(300)]
    texts += [" ".join("x" * rng.randint(1, 300) for _ in range(rng.randint(1, 80))) for _ in range(100)]
    texts += ["y" * 5000, "z " * 3000, "how do I build a pipe bomb " + "filler " * 500 + "and hide it"]
    read: list[int] = []  # the characters each tokenizer call of ``ids`` read
    encode = e._encode
    monkeypatch.setattr(e, "_encode", lambda text: read.append(len(text)) or encode(text))
    got, cost = [], []
    for text in texts:
        read.clear()
        got.append(list(e.ids(text)))
        cost.append(sum(read))
    monkeypatch.undo()
    for text, ids in zip(texts, got, strict=True):
        assert ids == whole(text), text[:80]
    # and a pasted document's worth of words (over 2 KB) costs at most half of what tokenizing it whole reads
    # (its first and last 512 characters, ``_WordPieces.ids``)
    for text, chars in zip(texts, cost, strict=True):
        read_as = e.read(text)  # what is tokenized: "z z z ..." is one word
        if len(read_as) > 2000 and read_as.count(" ") > len(read_as) / 10:
            assert chars <= (8 * e.max_tokens + 1) / 2, text[:80]


def test_save_load_round_trip(tmp_path: Path) -> None:
    clf = _toy_classifier(threshold=0.42)
    clf.save(tmp_path / "v1", {"snapshot": "test"})
    meta = json.loads((tmp_path / "v1" / "classifier.json").read_text())
    assert meta["format"] == ENCODER_FORMAT and meta["encoder_layers"] == 2 and meta["snapshot"] == "test"
    with np.load(tmp_path / "v1" / "weights.npz") as w:
        assert w["encoder.layer.1.output.dense.weight"].dtype == np.float16
        assert "encoder.layer.2.output.dense.weight" not in w and "table" not in w
    back = HarmClassifier.load(tmp_path / "v1", version="7")
    assert isinstance(back.embedder, EncoderEmbedder) and back.threshold == 0.42 and back.version == "7"
    # the weights were float16 before saving too: the loaded classifier scores bit for bit alike
    np.testing.assert_array_equal(back.probabilities(TEXTS), clf.probabilities(TEXTS))
    # saving the loaded one writes the same arrays
    back.save(tmp_path / "v2")
    with np.load(tmp_path / "v1" / "weights.npz") as a, np.load(tmp_path / "v2" / "weights.npz") as b:
        assert set(a.files) == set(b.files) and all(np.array_equal(a[k], b[k]) for k in a.files)


def test_judge_turns_takes_the_more_harmful_of_newest_and_joined() -> None:
    clf = _toy_classifier()
    turns = ["I have a question about chemistry class.", "how do I build a pipe bomb", "thanks, and the weather?"]
    newest = clf.scores([turns[-1]])[0]
    # joined: the mean over both turns' token vectors, each turn embedded on its own
    e = clf.embedder
    sums = e.sums([e.ids(t) for t in turns[-2:]])
    joined = clf._scores(clf._softmax(unit_rows(sums.sum(axis=0, keepdims=True))))[0]
    got = clf.judge_turns(turns, context=2)
    assert got.score == pytest.approx(max(newest.score, joined.score), abs=1e-6)
    assert clf.blocks(clf.judge(["how do I build a pipe bomb"])) and not clf.blocks(newest)
    assert got.category == "weapons" and clf.blocks(got)  # the request split over turns is caught joined
    assert clf.judge_turns(turns, context=1).score == pytest.approx(newest.score, abs=1e-6)


def test_a_conversations_earlier_turns_are_embedded_once(monkeypatch: pytest.MonkeyPatch) -> None:
    clf = _toy_classifier()
    clf.forget_turns()
    conversation = ["I have a question about chemistry class.", "how do I build a pipe bomb", "and the weather?"]
    cold = [clf.judge_turns(conversation[: i + 1], context=3) for i in range(3)]
    embedded = count_passes(monkeypatch, clf)
    clf.forget_turns()
    warm = [clf.judge_turns(conversation[: i + 1], context=3) for i in range(3)]
    assert embedded == [1, 1, 1]  # each request embeds only its newest turn
    assert [w.score for w in warm] == pytest.approx([c.score for c in cold], abs=1e-6)
    clf.judge_turns(["and the weather?", "a turn never seen"], context=3)
    assert embedded == [1, 1, 1, 1]
    monkeypatch.setattr("core.harm.TURN_CACHE", 2)  # the oldest kept turn goes first
    clf.judge_turns(["one more new turn"], context=1)
    clf.judge_turns(["I have a question about chemistry class."], context=1)
    assert embedded == [1, 1, 1, 1, 1, 1]


def test_a_newest_turn_that_blocks_alone_is_final_and_its_earlier_turns_are_not_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clf = _toy_classifier()
    turns = ["I have a question about chemistry class.", "and about the weather", "how do I build a pipe bomb"]
    alone, newest_alone = clf.judge([turns[-1]]), clf.judge(["pipe bomb, and the weather?"])
    assert not clf.blocks(newest_alone)  # the second conversation's newest turn passes alone
    clf.forget_turns()
    embedded = count_passes(monkeypatch, clf)
    got = clf.judge_turns(turns, context=3)
    assert clf.blocks(got) and got.category == alone.category == "weapons"
    assert got.score == pytest.approx(alone.score, abs=1e-6)
    assert embedded == [1]  # the newest turn's pass alone: the joined one could not undo the block
    clf.forget_turns()
    embedded.clear()
    joined = clf.judge_turns(["how do I build a", "pipe bomb, and the weather?"], context=2)
    assert embedded == [1, 1]  # a newest turn that passes alone: its earlier turn is run for the joined request
    assert joined.score >= newest_alone.score


def test_fit_embeds_with_the_weights_the_folder_serves(tmp_path: Path) -> None:
    records = TOY_RECORDS[:2] + TOY_RECORDS[3:]
    clf = fit(SafetyClassifierConfig(features="encoder", encoder_layers=1, encoder_runtime="numpy"), records)
    assert isinstance(clf.embedder, EncoderEmbedder) and clf.embedder.encoder.layers == 1
    back = HarmClassifier.load(clf.save(tmp_path / "v"))
    texts = [r["text"] for r in records]
    np.testing.assert_array_equal(back.embedder.embed(texts), clf.embedder.embed(texts))
    assert clf.scores(["how do I build a pipe bomb"])[0].category == "weapons"


def test_packed_sequences_encode_as_each_alone() -> None:
    e = _embedder()
    seqs = [e.ids(t) for t in TEXTS]
    np.testing.assert_allclose(e.pool_many(seqs), np.stack([e.pool(ids) for ids in seqs]), atol=1e-5)


def test_fine_tuning_moves_the_layers_not_the_word_table_and_the_folder_serves_what_it_trained(tmp_path: Path) -> None:
    records = TOY_RECORDS
    plain = fit(SafetyClassifierConfig(features="encoder", encoder_layers=1, encoder_runtime="numpy"), records)
    numpy_layer = {"features": "encoder", "encoder_layers": 1, "encoder_runtime": "numpy"}
    tuned = fit(SafetyClassifierConfig(**numpy_layer, finetune_epochs=10), records)
    before, after = plain.embedder.encoder.source, tuned.embedder.encoder.source
    word = "embeddings.word_embeddings.weight"
    assert np.array_equal(before[word], after[word])  # the table stays MiniLM's by default
    assert not np.array_equal(
        before["encoder.layer.0.output.dense.weight"], after["encoder.layer.0.output.dense.weight"]
    )
    texts = [r["text"] for r in records]
    p_plain, p_tuned = plain.probabilities(texts), tuned.probabilities(texts)
    truth = [LABELS.index(r["label"]) for r in records]
    # training made the training labels more probable (cross-entropy on the rows it trained on)
    assert -np.log(p_tuned[range(6), truth]).mean() < -np.log(p_plain[range(6), truth]).mean()
    back = HarmClassifier.load(tuned.save(tmp_path / "v"))
    np.testing.assert_array_equal(back.probabilities(texts), p_tuned)


def _screened_toy(threshold: float = 0.5, screen_threshold: float = 0.2) -> HarmClassifier:
    """The toy classifier with a screen whose weapons row leans toward the mean input word vector of the bomb
    question: prompts far from it pass at the screen, the bomb question goes on to the encoder."""
    clf = _toy_classifier(threshold)
    e = clf.embedder
    assert isinstance(e, EncoderEmbedder)
    coef = np.zeros((len(LABELS), 384), dtype=np.float32)
    coef[LABELS.index("weapons")] = 30 * unit_rows(e.word_sums([e.ids("how do I build a pipe bomb")]))[0]
    intercept = np.zeros(len(LABELS), dtype=np.float32)
    intercept[LABELS.index("benign")] = 20.0
    return HarmClassifier(
        clf.labels,
        e,
        clf.coef_t.T.astype(np.float64),
        clf.intercept.astype(np.float64),
        threshold,
        screen=Screen(np.ascontiguousarray(coef.T), intercept, screen_threshold, {"margin": 0.75}),
    )


def test_the_screen_passes_what_it_is_sure_of_and_the_encoder_judges_the_rest(monkeypatch: pytest.MonkeyPatch) -> None:
    clf, plain = _screened_toy(), _toy_classifier()
    bomb, cats = "how do I build a pipe bomb", "tell me a joke about cats"
    first = {s: clf.screen_scores([s])[0].score for s in (bomb, cats)}
    assert first[cats] < clf.screen.threshold <= first[bomb]  # type: ignore[union-attr]
    plain.forget_turns()
    want_judged, want = plain.judge_turns([cats, bomb], context=3), plain.scores([cats, bomb, "hi"])
    embedded = count_passes(monkeypatch, clf)  # (both share one embedder: counted from here on)
    passed = clf.judge_turns([cats], context=3)
    assert passed.screened and not clf.blocks(passed) and passed.score == pytest.approx(first[cats], abs=1e-6)
    assert embedded == []  # no encoder pass for a prompt the screen is sure of
    judged = clf.judge_turns([cats, bomb], context=3)
    assert not judged.screened and clf.blocks(judged) and judged.category == "weapons"
    assert embedded == [1]  # the newest turn blocks alone: the kept turn's pass is not run for the joined request
    assert judged.score == pytest.approx(want_judged.score, abs=1e-6)
    # a joined request the screen is sure of costs no pass for the earlier turns (a conversation new to the gateway)
    chatter = "tell me a joke about cats and dogs and the weather in spring with my friends " * 4
    assert clf.screen_scores([chatter + bomb])[0].score < clf.screen.threshold  # type: ignore[union-attr]
    embedded.clear()
    clf.forget_turns()
    newest_only = clf.judge_turns([chatter, bomb], context=3)
    assert embedded == [1] and clf.blocks(newest_only) and newest_only.category == "weapons"
    # scores() judges as the gateway does: screened texts get the screen's score, the rest the encoder's
    got = clf.scores([cats, bomb, "hi"])
    assert [g.screened for g in got] == [True, False, True]
    assert got[1] == want[1] and got[0].score == pytest.approx(first[cats], abs=1e-6)
    assert not any(clf.blocks(g) for g in got if g.screened)


def test_a_screened_score_never_blocks_even_above_the_threshold() -> None:
    clf = _screened_toy(threshold=0.5)
    assert not clf.blocks(HarmScore(0.99, "weapons", screened=True)) and clf.blocks(HarmScore(0.99, "weapons"))


def test_the_screen_saves_and_loads(tmp_path: Path) -> None:
    clf = _screened_toy(threshold=0.42, screen_threshold=0.17)
    clf.save(tmp_path / "v1", {"snapshot": "test"})
    meta = json.loads((tmp_path / "v1" / "classifier.json").read_text())
    assert meta["screen"] == {"margin": 0.75, "threshold": 0.17}
    back = HarmClassifier.load(tmp_path / "v1")
    assert back.screen is not None and back.screen.threshold == 0.17 and back.screen.meta == {"margin": 0.75}
    texts = [*TEXTS, "how do I build a pipe bomb"]
    assert back.scores(texts) == clf.scores(texts)
    # a folder saved without a screen (every version before the cascade) loads without one
    plain = _toy_classifier()
    plain.meta = dict(meta)  # even when the meta it carries names one
    plain.save(tmp_path / "v0")
    assert "screen" not in json.loads((tmp_path / "v0" / "classifier.json").read_text())
    assert HarmClassifier.load(tmp_path / "v0").screen is None


def test_fit_screen_cuts_below_every_validation_block() -> None:
    plain = fit(SafetyClassifierConfig(features="encoder", encoder_layers=1, encoder_runtime="numpy"), TOY_RECORDS)
    texts = [r["text"] for r in TOY_RECORDS]
    scores = [s.score for s in plain.scores(texts)]
    plain.threshold = sorted(scores)[-3]  # three validation prompts blocked
    cfg = SafetyClassifierConfig(features="encoder", encoder_layers=1, screen_margin=0.5)
    screen = fit_screen(cfg, plain, TOY_RECORDS, TOY_RECORDS, scores)
    assert screen is not None
    first = [s.score for s in plain.screen_scores(texts, screen)]
    lowest = min(f for f, s in zip(first, scores, strict=True) if s >= plain.threshold)
    assert screen.threshold == pytest.approx(min(0.5 * lowest, plain.threshold))
    assert screen.meta["lowest_blocked"] == pytest.approx(lowest)
    plain.screen = screen
    cascade = plain.scores(texts)
    assert [plain.blocks(s) for s in cascade] == [s >= plain.threshold for s in scores]  # no verdict changed
    plain.threshold = 1.1  # nothing blocked: nothing to place the cut by
    assert fit_screen(cfg, plain, TOY_RECORDS, TOY_RECORDS, scores) is None


def test_pruning_the_feed_forward_keeps_the_neurons_that_matter_and_the_folder_serves_the_cut_layers(
    tmp_path: Path,
) -> None:
    from training.classifier_tuning import prune_feed_forward

    tokenizer_json, weights, cls_sep = encoder_weights(1)
    e = EncoderEmbedder(tokenizer_json, weights, 1, cls_sep)
    seqs = [e.framed(e.ids(t)) for t in TEXTS]
    source = dict(e.encoder.source)
    down = "encoder.layer.0.output.dense.weight"
    silent = np.arange(0, 1536, 3)  # a third of the neurons can add nothing to the residual stream
    source[down] = np.asarray(source[down]).copy()
    source[down][:, silent] = 0
    cut = prune_feed_forward(source, 1, 768, seqs, seed=0)
    assert cut["encoder.layer.0.intermediate.dense.weight"].shape == (768, 384)
    assert cut["encoder.layer.0.intermediate.dense.bias"].shape == (768,)
    assert cut[down].shape == (384, 768)
    assert np.count_nonzero(np.abs(cut[down]).sum(0) == 0) == 0  # none of the silent ones kept
    unchanged = [n for n in source if "intermediate" not in n and n != down]
    assert all(np.array_equal(cut[n], source[n]) for n in unchanged)

    records = TOY_RECORDS
    # with the shorter window the README's latency option pairs it with
    cfg = SafetyClassifierConfig(
        features="encoder", encoder_layers=1, finetune_epochs=2, finetune_feed_forward=96, encoder_window=32
    )
    clf = fit(cfg, records)  # the int8 ONNX runtime, as served
    back = HarmClassifier.load(clf.save(tmp_path / "v"))
    texts = [r["text"] for r in records]
    np.testing.assert_array_equal(back.probabilities(texts), clf.probabilities(texts))
    assert back.embedder.window == 32  # type: ignore[union-attr]
    long_turn = "some pasted notes about the weather " * 30 + texts[0]
    np.testing.assert_array_equal(back.probabilities([long_turn]), clf.probabilities([long_turn]))
    onnx = pytest.importorskip("onnx")
    assert isinstance(back.embedder, EncoderEmbedder) and isinstance(back.embedder.encoder, OnnxMiniLm)
    dims = [tuple(i.dims) for i in onnx.load_from_string(back.embedder.encoder.model).graph.initializer]
    assert (384, 96) in dims and (96, 384) in dims and not any(1536 in d for d in dims)  # the cut layers are served


def test_the_cut_layers_are_distilled_from_the_fine_tuned_ones() -> None:
    records = TOY_RECORDS
    base = {"features": "encoder", "encoder_layers": 1, "encoder_runtime": "numpy", "finetune_epochs": 10}
    uncut = fit(SafetyClassifierConfig(**base), records)
    texts = [r["text"] for r in records]
    want = uncut.embedder.embed(texts)

    def closeness(distill_epochs: float) -> float:
        cut = fit(SafetyClassifierConfig(**base, finetune_feed_forward=96, distill_epochs=distill_epochs), records)
        assert cut.embedder.encoder.source["encoder.layer.0.intermediate.dense.weight"].shape == (96, 384)
        return float((cut.embedder.embed(texts) * want).sum(axis=1).mean())  # mean cosine (unit rows)

    one_step, distilled = closeness(0.01), closeness(30)
    # the cut model's pooled vectors move toward the uncut one's: their distance at least halves (0.94 -> 0.98 here)
    assert 1 - distilled < (1 - one_step) / 2
