"""Toxicity scoring behind a small Protocol, with one local implementation.

``ProfanityScorer`` wraps alt-profanity-check: a linear SVM over character/word n-grams, trained on ~200k
human-labelled comments and shipped inside the wheel (no download), ~10 µs per text. It scores insults and
profanity (what our poisoned scenario injects) well; it does not see subtle toxicity that avoids offensive
words. Production can put a transformer classifier behind the same Protocol.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol


class ToxicityScorer(Protocol):
    name: str

    def score(self, texts: Sequence[str]) -> list[float]:
        """Probability in [0, 1] that each text is toxic."""
        ...


class ProfanityScorer:
    name = "alt-profanity-check"

    def __init__(self) -> None:
        from profanity_check import predict_prob  # loads the bundled model (~1 s) on first use only

        self._predict = predict_prob

    def score(self, texts: Sequence[str]) -> list[float]:
        if not texts:
            return []
        return [float(p) for p in self._predict(list(texts))]
