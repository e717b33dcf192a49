"""Toxicity scoring: the ``ToxicityScorer`` Protocol and its two implementations, one seam for every stage.

The gateway's safety filters (``serving.safety.filters``), the eval suites (``evals.runner``,
``evals.behaviour``) and the shadow comparison (``serving.pipeline.shadow``) all score through this Protocol, so a
transformer classifier put behind it changes every one of them at once.

``ProfanityScorer`` wraps alt-profanity-check: a linear SVM over character/word n-grams, trained on ~200k
human-labelled comments and shipped inside the wheel (no download). It scores insults and profanity (what our
poisoned scenario injects) well; it does not see subtle toxicity that avoids offensive words.
``CompiledProfanityScorer`` is the same fitted model evaluated with numpy, the production scorer of both safety
filters (``benchmarks/safety_filters.py`` measures the two against each other).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Protocol

import numpy as np


class ToxicityScorer(Protocol):
    name: str

    def score(self, texts: Sequence[str]) -> list[float]:
        """Probability in [0, 1] that each text is toxic."""
        ...


class ProfanityScorer:
    """alt-profanity-check's ``predict_prob``, as the library ships it (~10 µs per text in a batch)."""

    name = "alt-profanity-check"

    def __init__(self) -> None:
        from profanity_check import predict_prob  # loads the bundled model (~1 s) on first use only

        self._predict = predict_prob

    def score(self, texts: Sequence[str]) -> list[float]:
        if not texts:
            return []
        return [float(p) for p in self._predict(list(texts))]


class CompiledProfanityScorer:
    """alt-profanity-check's own fitted model, evaluated with numpy instead of sklearn's ``predict_proba``.

    Why: ``ProfanityScorer`` costs 7-16 ms per call here (measured), almost all of it sklearn's per-call input
    validation in ``CalibratedClassifierCV`` (5 calibrated LinearSVCs), which alone breaks the pre-filter's 5 ms p99.
    The same vocabulary, idf weights, SVM coefficients and sigmoid calibrators give the same scores (tested to 1e-9)
    in tens of microseconds.
    """

    name = "alt-profanity-check"

    def __init__(self) -> None:
        from profanity_check import profanity_check as pc  # loads the bundled model (~1 s)

        vec, model = pc.vectorizer, pc.model
        if vec.norm != "l2" or not vec.use_idf or vec.sublinear_tf or vec.binary or model.method != "sigmoid":
            raise RuntimeError("alt-profanity-check's model changed shape; use core.toxicity.ProfanityScorer")
        clfs = model.calibrated_classifiers_
        self._analyze = vec.build_analyzer()
        self._vocab: dict[str, int] = vec.vocabulary_
        self._idf = np.asarray(vec.idf_, dtype=np.float64)
        self._coef = np.stack([c.estimator.coef_[0] for c in clfs], axis=1)  # (features, classifiers)
        self._intercept = np.array([c.estimator.intercept_[0] for c in clfs])
        self._a = np.array([c.calibrators[0].a_ for c in clfs])
        self._b = np.array([c.calibrators[0].b_ for c in clfs])

    def score(self, texts: Sequence[str]) -> list[float]:
        return [self._score_one(t) for t in texts]

    def flaggable_prefixes(self, threshold: float) -> frozenset[str]:
        """Every prefix of every vocabulary word that alone scores >= ``threshold`` (lowercase, as the vocabulary
        is). The model sees unigrams only, so a word being written that is no such prefix can never become a word
        the classifier flags: the post-filter may send it before it is finished."""
        words = list(self._vocab)
        flagged = [w for w, score in zip(words, self.score(words), strict=True) if score >= threshold]
        return frozenset(w[:i] for w in flagged for i in range(1, len(w) + 1))

    def _score_one(self, text: str) -> float:
        counts: dict[int, int] = {}
        for token in self._analyze(text):
            j = self._vocab.get(token)
            if j is not None:
                counts[j] = counts.get(j, 0) + 1
        decision = self._intercept
        if counts:
            idx = np.fromiter(counts.keys(), dtype=np.int64, count=len(counts))
            tfidf = np.fromiter(counts.values(), dtype=np.float64, count=len(counts)) * self._idf[idx]
            decision = decision + (tfidf / math.sqrt(float(tfidf @ tfidf))) @ self._coef[idx]
        return float(np.mean(1.0 / (1.0 + np.exp(self._a * decision + self._b))))
