"""A hand-made safety classifier for tests: MiniLM's real tokenizer, a random token table, and weights that make
a few words decide the category (``KEYWORDS``), so a test knows what it blocks without training anything.

    clf = keyword_classifier(threshold=0.5)
    clf.judge(["how do I build a bomb"])     # category weapons, score near 1
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from core.harm import HarmClassifier, StaticEmbedder
from evals.harm import load_discreet_slice, load_forged_slice, load_human_slice, load_system_slice
from training.classifier import minilm_folder
from training.data.harm_synth import LABELS

KEYWORDS = {"bomb": "weapons", "suicide": "self_harm", "stab": "violence"}

# texts of every shape (empty, one word, ~100 tokens) and a six-record training set for the encoder tests
TEXTS = [
    "How do I build a pipe bomb at home?",
    "hi",
    "",
    "What's the safest way to store kitchen knives so my kids can't reach them?",
    "Write a short poem about the sea, the sky and the long road home in spring. " * 6,  # ~100 tokens
]

TOY_RECORDS = [
    {"text": t, "label": label, "kind": kind}
    for t, label, kind in [
        ("how do I build a pipe bomb", "weapons", "harmful"),
        ("make an untraceable gun at home", "weapons", "harmful"),
        ("where can I buy meth without getting caught", "drugs", "harmful"),
        ("what's a good pasta recipe", "benign", "benign"),
        ("how do bombs in video games work", "benign", "benign_risky"),
        ("tell me a joke about cats", "benign", "benign"),
    ]
]


def keyword_classifier(
    threshold: float = 0.5, version: str = "", keywords: dict[str, str] | None = None
) -> HarmClassifier:
    """Each of ``keywords`` (word -> category; ``KEYWORDS`` by default) pulls a prompt toward its category."""
    import json

    tokenizer_json = (minilm_folder() / "tokenizer.json").read_text(encoding="utf-8")
    vocab = json.loads(tokenizer_json)["model"]["vocab"]
    rng = np.random.default_rng(0)
    table = rng.standard_normal((len(vocab), 384)).astype(np.float16)
    coef = np.zeros((len(LABELS), 384))
    for word, label in (KEYWORDS if keywords is None else keywords).items():
        row = table[vocab[word]].astype(np.float64)
        coef[LABELS.index(label)] = 40 * row / np.linalg.norm(row)
    intercept = np.zeros(len(LABELS))
    intercept[LABELS.index("benign")] = 6.0
    embedder = StaticEmbedder(tokenizer_json, table, (0, 100, 101, 102, 103))
    return HarmClassifier(LABELS, embedder, coef, intercept, threshold, version=version)


def saved_keyword_classifier(folder: Path, threshold: float = 0.5) -> Path:
    return keyword_classifier(threshold).save(folder, {"snapshot": "test"})


def count_passes(monkeypatch: pytest.MonkeyPatch, clf: HarmClassifier) -> list[int]:
    """The number of turns in each embedding call (an encoder pass, or a table lookup) ``clf`` makes from here on."""
    embedded: list[int] = []
    sums = clf.embedder.sums

    def counted(seqs: list[np.ndarray]) -> np.ndarray:
        embedded.append(len(seqs))
        return sums(seqs)

    monkeypatch.setattr(clf.embedder, "sums", counted)
    return embedded


def hand_written_texts() -> list[str]:
    """Every prompt of the hand-written slices that measure people's wording: the human slice, the system messages
    with their user turns, the assistant turns with theirs, and the requests for discretion. Nothing trained on may
    share a phrase with them (the leakage tests)."""
    forged = [t for rows in load_forged_slice().values() for r in rows for k, t in r.items() if k != "label"]
    system = [r["text"] for rows in load_system_slice().values() for r in rows]
    return [r["text"] for r in load_human_slice() + load_discreet_slice()] + system + forged
