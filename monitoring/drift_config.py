"""The drift check and the retrain policy: ``DriftConfig`` (how ``monitoring.drift.detect_drift`` compares a window
of prompts with the reference) and ``RetrainPolicy`` (when ``monitoring.retrain.decide_retrain`` starts a
retrain). Every number either uses lives here, so environments differ by YAML, not code.

Statistical tests and thresholds left at None take Evidently's choice, which depends on the sample size: up to
1000 reference rows a p-value test (K-S for numbers, Z or chi-square for pattern matches; drift when p < 0.05),
above that a distance (normed Wasserstein, Jensen-Shannon; drift when >= 0.1), because at tens of thousands of
rows a p-value flags differences too small to matter. The embedding drift methods are Evidently's
(``evidently.legacy.metrics.data_drift.embedding_drift_methods``), called without the t-SNE plot.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator, model_validator

from core.config import StrictModel

Descriptor = Literal["length", "word_count", "non_letter_pct"]
EmbeddingMethod = Literal["model", "distance", "mmd", "ratio"]
DriftRule = Literal["either", "both", "embedding", "descriptors"]
# Evidently's registered column tests (evidently.legacy.calculations.stattests) that fit numbers / match flags
NumericStattest = Literal[
    "ks", "wasserstein", "psi", "jensenshannon", "kl_div", "anderson", "cramer_von_mises", "mannw", "ed", "es",
    "t_test", "empirical_mmd", "hellinger",
]  # fmt: skip
CategoricalStattest = Literal["z", "chisquare", "jensenshannon", "psi", "kl_div", "fisher_exact", "g_test", "TVD"]

DEFAULT_DESCRIPTORS: tuple[Descriptor, ...] = ("length", "word_count", "non_letter_pct")
DEFAULT_PATTERNS: dict[str, str] = {
    "digits": r"\d",
    "question": r"\?\s*$",
    "code": r"```|\b(?:def|class|import|function|SELECT)\b|[{};]\s*$",
    "link": r"https?://|www\.",
}
# the (n_ref + n_cur)^2 kernel of the MMD method: 5000 rows a side is 800 MB of float64
_MMD_MAX_ROWS = 5000


class DriftConfig(StrictModel):
    """How the monitor compares the current window of prompts with the reference (the champion's training
    prompts): text descriptors tested column by column, MiniLM embeddings by one multivariate method."""

    window_hours: float = Field(
        24, gt=0, description="Length of the current window: the monitor reads the request log of the last hours."
    )
    min_samples: int = Field(
        200,
        ge=10,
        description="Non-empty prompts needed on each side (reference and current); fewer makes the report "
        "inconclusive (never drifted).",
    )
    max_rows: int = Field(
        20_000,
        ge=10,
        description="Prompts per side the descriptors are computed on; larger sides are sampled (seeded).",
    )
    max_embedded_rows: int = Field(
        500,
        ge=10,
        description="Prompts per side that are embedded (a seeded sample): embedding is the slow part (MiniLM on "
        "one thread of a busy 2-core CPU: ~220 short prompts a second), and 500 a side keeps a 10k-request "
        "window near 5 s (benchmarks/drift.py).",
    )
    embed_distinct: bool = Field(
        True,
        description="Embed each side's distinct prompts (a prompt repeated within a side counts once). The model "
        "method's classifier (more dimensions than training rows) memorizes a repeat that lands in both its "
        "training and test halves: two samples of the same normal traffic scored ROC AUC 0.58 (drift) with "
        "repeats and 0.50 without. How often prompts repeat still shows in the descriptors.",
    )
    min_embedded: int = Field(
        50,
        ge=10,
        description="Prompts per side (distinct ones with embed_distinct) the embedding view needs; with fewer it "
        "is skipped (and a rule that needs it is inconclusive).",
    )
    descriptors: list[Descriptor] = Field(
        default_factory=lambda: list(DEFAULT_DESCRIPTORS),
        description="Numeric text descriptors (Evidently: TextLength, WordCount, NonLetterCharacterPercentage). "
        "OOV and sentiment are not offered: they download NLTK data.",
    )
    patterns: dict[str, str] = Field(
        default_factory=lambda: dict(DEFAULT_PATTERNS),
        description="Named regular expressions; each becomes a 0/1 descriptor (Evidently TextMatch, regex: "
        "re.search, case-sensitive unless the pattern says (?i)) whose match share is compared.",
    )
    num_stattest: NumericStattest | None = Field(
        None,
        description="Test for the numeric descriptors; None: Evidently's choice by sample size (K-S / Wasserstein).",
    )
    num_threshold: float | None = Field(
        None, gt=0, description="Threshold of num_stattest (p-value or distance); None: the test's default."
    )
    cat_stattest: CategoricalStattest | None = Field(
        None, description="Test for the pattern descriptors; None: Evidently's choice (Z-test / Jensen-Shannon)."
    )
    cat_threshold: float | None = Field(
        None, gt=0, description="Threshold of cat_stattest (p-value or distance); None: the test's default."
    )
    drift_share: float = Field(
        0.5, gt=0, le=1, description="Share of descriptors that must drift for the descriptors to count as drifted."
    )
    embedding_method: EmbeddingMethod = Field(
        "model",
        description="Evidently's embedding drift method: model (a classifier told to separate reference from "
        "current; score ROC AUC), distance (between the mean embeddings), mmd (maximum mean discrepancy), ratio "
        "(share of drifted components).",
    )
    embedding_threshold: float | None = Field(
        None,
        gt=0,
        description="Drift when the method's score exceeds this; None: the method's default (model 0.55, "
        "distance 0.2, mmd 0.015, ratio 0.2). Unused when the bootstrap decides.",
    )
    embedding_bootstrap: bool | None = Field(
        None,
        description="model/distance/mmd: decide against a bootstrap of the no-drift score instead of the fixed "
        "threshold; None: Evidently's rule (bootstrap below 1000 embedded reference rows, so with the default "
        "max_embedded_rows: the model method's ROC AUC against a percentile of chance AUCs).",
    )
    embedding_quantile: float = Field(
        0.99,
        gt=0.5,
        lt=1,
        description="With the bootstrap (model, distance): the percentile of the no-drift scores a window must "
        "pass. Evidently's 0.95 is a 5% false alarm per check on unchanged traffic (one in four seeds of the "
        "default loop's normal users was flagged, ROC AUC 0.57); 0.99 still flags the drifted profile (0.83-0.86).",
    )
    embedding_pca_components: int | None = Field(
        None, ge=2, description="Reduce the embeddings to this many PCA components first; None: use all."
    )
    rule: DriftRule = Field(
        "either",
        description="When the window has drifted: either (embeddings or descriptors), both, embedding (only), "
        "descriptors (only). Without the embedding view (no embedder, too few prompts), 'either' judges by the "
        "descriptors and 'both' and 'embedding' are inconclusive.",
    )
    seed: int = Field(0, description="Seed of the row sampling (the same inputs give the same report).")
    histogram_bins: int = Field(20, ge=2, le=100, description="Bins of the descriptor histograms in the report.")

    @field_validator("patterns")
    @classmethod
    def _patterns_compile(cls, patterns: dict[str, str]) -> dict[str, str]:
        for name, pattern in patterns.items():
            if not re.fullmatch(r"[a-z][a-z0-9_]*", name):
                raise ValueError(f"pattern name {name!r}: use lowercase letters, digits and underscores")
            try:
                re.compile(pattern)
            except re.error as exc:
                raise ValueError(f"pattern {name!r} is not a regular expression: {exc}") from None
        return patterns

    @model_validator(mode="after")
    def _sizes(self) -> DriftConfig:
        if not self.descriptors and not self.patterns and self.rule != "embedding":
            raise ValueError(f"rule {self.rule!r} needs at least one descriptor or pattern")
        if self.max_rows < self.min_samples or self.max_embedded_rows < self.min_samples:
            raise ValueError("max_rows and max_embedded_rows must be at least min_samples")
        if self.min_embedded > self.max_embedded_rows:
            raise ValueError("min_embedded must be at most max_embedded_rows")
        if self.embedding_method == "mmd" and self.max_embedded_rows > _MMD_MAX_ROWS:
            raise ValueError(
                f"embedding_method mmd builds a kernel of (2 x max_embedded_rows)^2 values: "
                f"keep max_embedded_rows <= {_MMD_MAX_ROWS}"
            )
        return self


class RetrainPolicy(StrictModel):
    """When drift starts a retrain: drift **and** a quality signal, outside the cooldown, past the loop guard
    (see ``monitoring.retrain`` for the exact rules)."""

    cooldown_hours: float = Field(
        24, ge=0, description="Hours after a retrain was triggered during which no other retrain is triggered."
    )
    safety_hit_tolerance: float = Field(
        0.02,
        ge=0,
        le=1,
        description="The window's safety-hit rate (pre + post filter) must exceed the champion baseline's by more "
        "than this (significantly, at alpha) to count as a quality signal.",
    )
    refusal_tolerance: float = Field(
        0.05,
        ge=0,
        le=1,
        description="The window's refusal rate must exceed the champion baseline's by more than this "
        "(significantly, at alpha) to count as a quality signal.",
    )
    alpha: float = Field(0.05, gt=0, lt=0.5, description="Significance level of the rate-rise tests (one-sided).")
    min_rate_samples: int = Field(
        100, ge=1, description="Answered requests needed on each side (window and baseline) before a rate is tested."
    )
    min_new_curated: int = Field(
        500,
        ge=1,
        description="New curated conversations (since the last retrain's snapshot) that count as a quality "
        "signal on their own.",
    )
    min_champion_share: float = Field(
        0.8,
        ge=0,
        le=1,
        description="Loop guard: share of the window's answered requests the current champion must have served "
        "(a window served mostly by another version says nothing about the champion and its reference).",
    )
    min_samples_after_retrain: int = Field(
        500,
        ge=0,
        description="Loop guard: a champion that came out of a drift retrain must have served this many requests "
        "since its promotion, in a window starting after it, before drift can trigger another retrain.",
    )
