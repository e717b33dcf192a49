"""The harm-intent classifier at run time: load a trained folder, score prompts. Training writes the folder
(``training.classifier``), the gateway's pre- and post-filter read it (``serving.safety.harm_filter``), the evals score
with it (``evals.harm``).

    clf = HarmClassifier.load(folder)
    clf.judge(["How do I build a pipe bomb?"])   # HarmScore(score=0.97, category="weapons")

The model is a multinomial logistic regression over the labels (the harm categories and ``benign``) on a static
sentence embedding: the text's WordPiece tokens (all-MiniLM-L6-v2's tokenizer) looked up in a table of per-token
vectors distilled from MiniLM (each token run through the encoder alone, once, at training time) and averaged,
then L2-normalized. So a prompt costs one Rust tokenization and a table lookup (~0.3 ms), not an encoder pass
(~25 ms on a busy CPU core), and words that MiniLM places near each other score alike. The harm score is
1 - P(benign); the category is the most probable harm label. Why this model: docs/results.md, "The safety
classifier".

The folder holds ``classifier.json`` (labels, operating threshold, provenance), ``weights.npz`` (the token
table in float16, coefficients, intercepts) and ``tokenizer.json``: plain arrays and JSON, no pickle, so loading
a registered version runs no code from the artifact store. Needs ``tokenizers`` and NumPy only (no torch).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

CONFIG_FILE = "classifier.json"
WEIGHTS_FILE = "weights.npz"
TOKENIZER_FILE = "tokenizer.json"
FORMAT = "harm-static-embedding-v1"
MAX_TOKENS = 512  # a longer text is judged by its first and last 256 tokens


class StaticEmbedder:
    """Texts -> mean of their tokens' table rows, L2-normalized (one row per text)."""

    def __init__(self, tokenizer_json: str, table: NDArray[Any], skip_ids: tuple[int, ...]) -> None:
        from tokenizers import Tokenizer

        self.tokenizer = Tokenizer.from_str(tokenizer_json)
        self.tokenizer.no_padding()
        self.tokenizer.no_truncation()
        self.tokenizer_json = tokenizer_json
        self.table = np.asarray(table, dtype=np.float32)  # float16 on disk; float32 here (NumPy's float16 is slow)
        self.skip = np.zeros(table.shape[0], dtype=bool)
        self.skip[list(skip_ids)] = True

    def ids(self, text: str) -> NDArray[np.int64]:
        """The text's token ids without special tokens; a long text by its first and last characters (whatever
        lies beyond ``MAX_TOKENS`` tokens' worth would be cut anyway). One ``encode`` per text: ``encode_batch``
        starts a thread pool, slower for a few texts and contending with the gateway's own threads."""
        if len(text) > 8 * MAX_TOKENS:
            text = text[: 4 * MAX_TOKENS] + "\n" + text[-4 * MAX_TOKENS :]
        ids = np.asarray(self.tokenizer.encode(text, add_special_tokens=False).ids, dtype=np.int64)
        return ids[~self.skip[ids]]

    def pool(self, ids: NDArray[np.int64]) -> NDArray[np.float32]:
        if len(ids) > MAX_TOKENS:
            ids = np.concatenate([ids[: MAX_TOKENS // 2], ids[-MAX_TOKENS // 2 :]])
        if not len(ids):
            return np.zeros(self.table.shape[1], dtype=np.float32)
        vec = self.table[ids].mean(axis=0)
        return np.asarray(vec / (np.linalg.norm(vec) or 1.0), dtype=np.float32)

    def embed(self, texts: list[str]) -> NDArray[np.float32]:
        if not texts:
            return np.zeros((0, self.table.shape[1]), dtype=np.float32)
        return np.stack([self.pool(self.ids(t)) for t in texts])


@dataclass(frozen=True)
class HarmScore:
    """The classifier's judgement of one prompt: ``score`` = P(harmful), ``category`` its most likely harm."""

    score: float
    category: str


class HarmClassifier:
    def __init__(
        self,
        labels: tuple[str, ...],
        embedder: StaticEmbedder,
        coef: NDArray[np.float64],
        intercept: NDArray[np.float64],
        threshold: float,
        version: str = "",
        meta: dict[str, Any] | None = None,
    ) -> None:
        if "benign" not in labels or coef.shape != (len(labels), embedder.table.shape[1]):
            raise ValueError("a harm classifier needs a 'benign' label and one coefficient row per label")
        self.labels = labels
        self.embedder = embedder
        self.coef_t = np.ascontiguousarray(coef.T, dtype=np.float32)
        self.intercept = intercept.astype(np.float32)
        self.threshold = threshold
        self.version = version
        self.meta = dict(meta or {})
        self._benign = labels.index("benign")
        self.categories = tuple(label for label in labels if label != "benign")

    # --- scoring ------------------------------------------------------------------------------------------

    def probabilities(self, texts: list[str]) -> NDArray[np.float64]:
        """(len(texts), len(labels)) class probabilities."""
        return self._softmax(self.embedder.embed(texts))

    def _softmax(self, x: NDArray[np.float32]) -> NDArray[np.float64]:
        logits = (x @ self.coef_t + self.intercept).astype(np.float64)
        logits -= logits.max(axis=1, keepdims=True)
        p = np.exp(logits)
        return np.asarray(p / p.sum(axis=1, keepdims=True))

    def scores(self, texts: list[str]) -> list[HarmScore]:
        return self._scores(self.probabilities(texts))

    def _scores(self, probs: NDArray[np.float64]) -> list[HarmScore]:
        harm = np.delete(probs, self._benign, axis=1)
        return [
            HarmScore(float(1.0 - row[self._benign]), self.categories[int(np.argmax(h))])
            for row, h in zip(probs, harm, strict=True)
        ]

    def judge(self, texts: list[str]) -> HarmScore:
        """The most harmful of ``texts``."""
        return max(self.scores(texts), key=lambda s: s.score)

    def judge_turns(self, turns: list[str], context: int) -> HarmScore:
        """The newest of ``turns`` alone, and the newest ``context`` of them joined (a request split over
        turns), each turn tokenized once: the more harmful of the two."""
        ids = [self.embedder.ids(t) for t in turns[-context:]]
        rows = [self.embedder.pool(ids[-1])]
        if len(ids) > 1:
            rows.append(self.embedder.pool(np.concatenate(ids)))
        return max(self._scores(self._softmax(np.stack(rows))), key=lambda s: s.score)

    def blocks(self, score: HarmScore) -> bool:
        return score.score >= self.threshold

    # --- files --------------------------------------------------------------------------------------------

    def save(self, folder: Path, extra: dict[str, Any] | None = None) -> Path:
        folder.mkdir(parents=True, exist_ok=True)
        np.savez(
            folder / WEIGHTS_FILE,
            table=self.embedder.table.astype(np.float16),
            coef=self.coef_t.T,
            intercept=self.intercept,
            skip_ids=np.flatnonzero(self.embedder.skip),
        )
        (folder / TOKENIZER_FILE).write_text(self.embedder.tokenizer_json, encoding="utf-8")
        meta = {
            **self.meta,
            **(extra or {}),
            "format": FORMAT,
            "labels": list(self.labels),
            "threshold": self.threshold,
        }
        self.meta = meta
        (folder / CONFIG_FILE).write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        return folder

    @classmethod
    def load(cls, folder: Path, version: str = "") -> HarmClassifier:
        meta = json.loads((folder / CONFIG_FILE).read_text(encoding="utf-8"))
        if meta.get("format") != FORMAT:
            raise ValueError(f"{folder}: not a {FORMAT} classifier (format {meta.get('format')!r})")
        with np.load(folder / WEIGHTS_FILE) as w:
            table, coef, intercept, skip = w["table"], w["coef"], w["intercept"], w["skip_ids"]
        embedder = StaticEmbedder(
            (folder / TOKENIZER_FILE).read_text(encoding="utf-8"), table, tuple(int(i) for i in skip)
        )
        return cls(tuple(meta["labels"]), embedder, coef, intercept, float(meta["threshold"]), version, meta)
