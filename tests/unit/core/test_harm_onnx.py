"""The harm classifier's encoder as an int8 ONNX graph (``core.minilm_onnx``, ``training.onnx_encoder``): the exported
graph computes what the NumPy layers compute (float32 export), the int8 one stays close to it and scores a turn the
same whatever it is judged with, and a trained folder carries the graph, loads back to the same scores and judges
conversations like the NumPy encoder's folders do. Two layers keep it to seconds; the default's six export alike."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

import numpy as np
import pytest
from support.harm_fixture import TEXTS, TOY_RECORDS

from core.harm import ONNX_FILE, EncoderEmbedder, HarmClassifier
from core.minilm_onnx import DISABLED_OPTIMIZERS, LEGACY_MASK, WORD, OnnxMiniLm
from training.classifier import encoder_weights, fit
from training.classifier_config import SafetyClassifierConfig

pytest.importorskip("onnxruntime")


@cache
def _numpy(layers: int = 2) -> EncoderEmbedder:
    tokenizer_json, weights, cls_sep = encoder_weights(layers)
    return EncoderEmbedder(tokenizer_json, weights, layers, cls_sep)


@cache
def _onnx(quantize: bool, layers: int = 2) -> EncoderEmbedder:
    from training.onnx_encoder import export_int8

    e = _numpy(layers)
    source = e.encoder.source
    graph = export_int8(source, layers, quantize)
    return EncoderEmbedder(e.tokenizer_json, {WORD: source[WORD]}, layers, e.cls_sep, graph)


def test_the_float32_graph_computes_what_the_numpy_layers_compute() -> None:
    e, g = _numpy(), _onnx(quantize=False)
    assert isinstance(g.encoder, OnnxMiniLm) and g.encoder.layers == 2
    seqs = [e.ids(t) for t in TEXTS]
    np.testing.assert_allclose(g.sums(seqs), e.sums(seqs), rtol=1e-4, atol=2e-3)
    np.testing.assert_allclose(g.embed(TEXTS), e.embed(TEXTS), atol=1e-5)


def test_the_int8_graph_stays_close_and_leaves_the_word_table_alone() -> None:
    e, g = _numpy(), _onnx(quantize=True)
    seqs = [g.ids(t) for t in TEXTS]
    # a sequence scores the same whatever it is judged with (int8 scales are set per run)
    np.testing.assert_array_equal(g.sums(seqs), np.concatenate([g.sums([s]) for s in seqs]))
    cosines = (g.embed(TEXTS) * e.embed(TEXTS)).sum(axis=1)
    assert cosines.min() > 0.98, cosines
    assert not np.array_equal(g.embed(TEXTS), e.embed(TEXTS))  # it is quantized, not the float32 graph again
    np.testing.assert_array_equal(g.encoder.word, e.encoder.word)  # the screen's features are unchanged
    assert g.sums([]).shape == (0, 384)


def test_a_trained_folder_carries_the_graph_and_serves_what_training_scored(tmp_path: Path) -> None:
    cfg = SafetyClassifierConfig(features="encoder", encoder_layers=2, finetune_epochs=1)
    assert cfg.encoder_runtime == "onnx-int8"  # the default
    clf = fit(cfg, TOY_RECORDS)
    assert isinstance(clf.embedder, EncoderEmbedder) and isinstance(clf.embedder.encoder, OnnxMiniLm)
    folder = clf.save(tmp_path / "v", {"snapshot": "test"})
    meta = json.loads((folder / "classifier.json").read_text())
    assert meta["encoder_runtime"] == "onnx-int8" and meta["encoder_layers"] == 2
    # the optimizers its threshold was chosen without, so the gateway runs the graph as training scored it
    assert meta["onnx_disabled_optimizers"] == list(DISABLED_OPTIMIZERS)
    assert meta["onnxruntime"] == __import__("onnxruntime").__version__  # which kernels scored it
    graph = __import__("onnx").load(str(folder / ONNX_FILE))
    # the standard operator set only: loading a registered version runs no custom operator's code
    assert {n.domain for n in graph.graph.node} == {""} and "MatMulInteger" in {n.op_type for n in graph.graph.node}
    assert [i.name for i in graph.graph.input] == ["ids"]  # one unpadded sequence a run: no mask arithmetic
    with np.load(folder / "weights.npz") as w:  # the graph holds the layers; the folder keeps the table for the screen
        assert WORD in w.files and not [n for n in w.files if n.startswith("encoder.layer.")]
    back = HarmClassifier.load(folder, version="3")
    assert isinstance(back.embedder, EncoderEmbedder) and isinstance(back.embedder.encoder, OnnxMiniLm)
    assert back.embedder.encoder.disabled_optimizers == DISABLED_OPTIMIZERS
    texts = [r["text"] for r in TOY_RECORDS]
    np.testing.assert_array_equal(back.probabilities(texts), clf.probabilities(texts))
    assert back.scores(["how do I build a pipe bomb"])[0].category == "weapons"
    # a conversation: newest turn and joined turns, as with the NumPy encoder
    judged = back.judge_turns(["hi", "tell me a joke about cats", "how do I build a pipe bomb"], context=3)
    alone = back.scores(["how do I build a pipe bomb"])[0]
    assert judged.category == "weapons" and judged.score >= alone.score
    # saving the loaded version writes the same graph
    back.save(tmp_path / "again")
    assert (tmp_path / "again" / ONNX_FILE).read_bytes() == (folder / ONNX_FILE).read_bytes()


def test_an_unknown_encoder_runtime_is_refused(tmp_path: Path) -> None:
    clf = fit(SafetyClassifierConfig(features="encoder", encoder_layers=1, finetune_epochs=0), TOY_RECORDS)
    folder = clf.save(tmp_path / "v")
    meta = json.loads((folder / "classifier.json").read_text())
    (folder / "classifier.json").write_text(json.dumps({**meta, "encoder_runtime": "tensorrt"}))
    with pytest.raises(ValueError, match="unknown encoder runtime 'tensorrt'"):
        HarmClassifier.load(folder)


def test_the_disabled_fusion_is_what_a_version_is_run_with_and_a_graph_with_a_mask_still_runs() -> None:
    import onnx

    e, g = _numpy(), _onnx(quantize=True)
    seqs = [g.framed(g.ids(t)) for t in TEXTS]  # what the encoder reads: [CLS] ids [SEP]
    graph = g.encoder.model
    fused, unfused = (OnnxMiniLm(graph, e.encoder.word, 2, d) for d in ((), DISABLED_OPTIMIZERS))
    # the two sessions differ in the last bits at least: which one a version runs is not a matter of taste
    assert not np.array_equal(fused.sum_many(seqs), unfused.sum_many(seqs))
    np.testing.assert_allclose(fused.sum_many(seqs), unfused.sum_many(seqs), rtol=0.1, atol=0.5)
    # a graph exported before 2026-11-29 also declares an attention mask: it is fed one (all ones), and the run works
    legacy = onnx.load_from_string(graph)
    legacy.graph.input.append(onnx.helper.make_tensor_value_info(LEGACY_MASK, onnx.TensorProto.INT64, ["b", "t"]))
    old = OnnxMiniLm(legacy.SerializeToString(), e.encoder.word, 2, DISABLED_OPTIMIZERS)
    np.testing.assert_array_equal(old.sum_many(seqs), unfused.sum_many(seqs))
