"""Prompt drift: a window of the request log's prompts against the reference (the prompts of the champion's training
snapshot), with Evidently. ``detect_drift(reference, current, cfg, embedder) -> DriftReport``, a pure function
apart from the clock it reads for its timings.

    report = detect_drift(snapshot_prompts, window_prompts(rows), cfg.drift, MiniLmEmbedder(threads=1),
                          current_rates=window_rates(rows), reference_rates=baseline, window=window_span(rows, t0, t1))
    report.drifted, report.reason          # the verdict and one line of why
    monitoring.drift_html.render_html(report)  # a small self-contained page (no t-SNE, no JavaScript)

Compare like with like: the reference is the opening user prompt of each snapshot record, the window's side the
opening prompt of each conversation (``monitoring.window.window_prompts``, beside ``window_rates`` and
``window_span``); follow-up turns on one side only look like drift.

Two views of the same prompts, each sampled (seeded) to a size the config caps:

- **descriptors** (Evidently ``Dataset`` descriptors: TextLength, WordCount, NonLetterCharacterPercentage, and a
  TextMatch regex flag per configured pattern), each column tested by an Evidently ``ValueDrift`` metric in a
  ``Report``. A descriptor constant and equal on both sides (a pattern neither side matches) carries no
  information: it is reported but left out of the drifted share;
- **embeddings** (``core.embedding.Embedder``, MiniLM in production) of each side's distinct prompts
  (``cfg.embed_distinct``: repeats would leak between the classifier's training and test halves), both sides in
  one ``encode`` call: one of Evidently's embedding drift methods, called directly. Evidently's
  ``EmbeddingsDrift`` metric also fits a t-SNE for its plot, which took 98% of a 105-187 s report on 10k rows: it
  is not used.

``cfg.rule`` combines the two views. Fewer than ``cfg.min_samples`` non-empty prompts on either side, or a rule
that needs the embeddings without an embedder (or with fewer than ``cfg.min_embedded`` prompts to embed), makes
the report ``inconclusive``: never drifted, with the reason.
The window's safety-hit and refusal rates ride along (``WindowRates``) for the retrain decision; they do not
enter the drift verdict. Evidently (~10 s to import) is imported on the first call, not with this module.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import Any, Literal

import numpy as np
from numpy.typing import NDArray
from pydantic import BaseModel, ConfigDict, Field

from core.embedding import Embedder
from monitoring.drift_config import DriftConfig
from monitoring.window import WindowRates, WindowSpan

__all__ = [
    "DescriptorDrift",
    "DriftReport",
    "EmbeddingDrift",
    "Histogram",
    "Timings",
    "detect_drift",
]

Status = Literal["drifted", "no_drift", "inconclusive"]
_TEXT = "prompt"
_PATTERN_PREFIX = "pattern_"
# Evidently's rule for its embedding methods when ``embedding_bootstrap`` is None
_BOOTSTRAP_BELOW = 1000


class _Result(BaseModel):
    """Base of the result records: immutable, strict about keys, JSON round-trippable."""

    model_config = ConfigDict(frozen=True, extra="forbid")


class Histogram(_Result):
    """Shares of each side's values per bin (``edges`` has one more entry than each share list)."""

    edges: list[float]
    reference: list[float]
    current: list[float]


class DescriptorDrift(_Result):
    """One descriptor column. ``score`` is a p-value (drift when below ``threshold``) or a distance (drift when at
    or above it), as ``score_kind`` says; ``drifted`` is Evidently's verdict. Means are of the descriptor values
    (for a pattern: the share of prompts matching it)."""

    name: str
    kind: Literal["numerical", "pattern"]
    method: str
    score_kind: Literal["p_value", "distance"]
    score: float | None
    threshold: float
    drifted: bool
    informative: bool
    reference_mean: float
    current_mean: float
    histogram: Histogram | None = None


class EmbeddingDrift(_Result):
    """The embedding view: Evidently's method, its score (model: ROC AUC of a reference-vs-current classifier;
    distance; mmd; ratio: share of drifted components) and verdict. ``threshold`` is None when a bootstrap of the
    no-drift score decided instead."""

    method: str
    score: float
    threshold: float | None
    bootstrap: bool
    drifted: bool
    reference_rows: int
    current_rows: int
    dimensions: int
    distinct: bool = True


class Timings(_Result):
    """Wall seconds of each stage (the first call in a process also pays Evidently's import, ~10 s, in
    ``descriptors_s``)."""

    descriptors_s: float = 0.0
    embedding_s: float = 0.0
    embedding_drift_s: float = 0.0
    total_s: float = 0.0


class DriftReport(_Result):
    """The comparison of one window with the reference (see the module docstring)."""

    status: Status
    drifted: bool
    reason: str
    rule: str
    reference_n: int
    current_n: int
    dropped_empty: int = 0
    descriptors: list[DescriptorDrift] = Field(default_factory=list)
    drifted_share: float | None = None
    drift_share_threshold: float
    embedding: EmbeddingDrift | None = None
    current_rates: WindowRates | None = None
    reference_rates: WindowRates | None = None
    window: WindowSpan | None = None
    seconds: Timings = Field(default_factory=Timings)
    config_hash: str

    def to_dict(self) -> dict[str, Any]:
        """JSON-able (``json.dumps`` works); ``from_dict`` reads it back."""
        return self.model_dump(mode="json")

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DriftReport:
        return cls.model_validate(data)

    def metrics(self) -> dict[str, float]:
        """Flat numbers for the tracker (MLflow metrics)."""
        out: dict[str, float] = {
            "drift.drifted": float(self.drifted),
            "drift.inconclusive": float(self.status == "inconclusive"),
            "drift.reference_n": float(self.reference_n),
            "drift.current_n": float(self.current_n),
            "drift.seconds": self.seconds.total_s,
        }
        if self.drifted_share is not None:
            out["drift.descriptors.drifted_share"] = self.drifted_share
        for d in self.descriptors:
            if d.score is not None:
                out[f"drift.descriptors.{d.name}.score"] = d.score
            out[f"drift.descriptors.{d.name}.current_mean"] = d.current_mean
        if self.embedding is not None:
            out["drift.embedding.score"] = self.embedding.score
        for side, rates in (("current", self.current_rates), ("reference", self.reference_rates)):
            if rates is not None:
                for name, value in (("safety_hit_rate", rates.safety_hit_rate), ("refusal_rate", rates.refusal_rate)):
                    if value is not None:
                        out[f"rates.{side}.{name}"] = value
        return out


# --- the check ------------------------------------------------------------------------------------------------


def detect_drift(
    reference: Sequence[str | None],
    current: Sequence[str | None],
    cfg: DriftConfig,
    embedder: Embedder | None = None,
    *,
    current_rates: WindowRates | None = None,
    reference_rates: WindowRates | None = None,
    window: WindowSpan | None = None,
) -> DriftReport:
    """Compare ``current`` prompts with ``reference`` prompts (empty and None entries are dropped); see the module
    docstring. ``embedder`` None skips the embedding view."""
    started = time.perf_counter()
    ref = [t for t in reference if t and t.strip()]
    cur = [t for t in current if t and t.strip()]
    base: dict[str, Any] = {
        "rule": cfg.rule,
        "reference_n": len(ref),
        "current_n": len(cur),
        "dropped_empty": len(reference) - len(ref) + len(current) - len(cur),
        "drift_share_threshold": cfg.drift_share,
        "current_rates": current_rates,
        "reference_rates": reference_rates,
        "window": window,
        "config_hash": cfg.config_hash(),
    }
    sizes = (("reference", len(ref)), ("current", len(cur)))
    short = [f"{side} {n} < {cfg.min_samples}" for side, n in sizes if n < cfg.min_samples]
    needs_embedding = cfg.rule in ("both", "embedding")
    if short or (needs_embedding and embedder is None):
        why = "too few prompts: " + ", ".join(short) if short else f"rule {cfg.rule!r} needs an embedder, none given"
        total = Timings(total_s=time.perf_counter() - started)
        return DriftReport(status="inconclusive", drifted=False, reason=why, seconds=total, **base)

    ref_order, cur_order = _order(len(ref), cfg.seed, 0), _order(len(cur), cfg.seed, 1)
    t0 = time.perf_counter()
    descriptors = _descriptor_drift(_pick(ref, ref_order, cfg.max_rows), _pick(cur, cur_order, cfg.max_rows), cfg)
    t1 = time.perf_counter()
    embedding, embed_s, notes = None, 0.0, []
    if embedder is not None:
        ref_pool, cur_pool = (_distinct(ref), _distinct(cur)) if cfg.embed_distinct else (ref, cur)
        kind = "distinct prompts" if cfg.embed_distinct else "prompts"
        if min(len(ref_pool), len(cur_pool)) < cfg.min_embedded:
            notes.append(
                f"embeddings skipped: {len(ref_pool)} reference and {len(cur_pool)} current {kind}, "
                f"need {cfg.min_embedded} a side"
            )
        else:
            ref_e = _pick(ref_pool, _order(len(ref_pool), cfg.seed, 2), cfg.max_embedded_rows)
            cur_e = _pick(cur_pool, _order(len(cur_pool), cfg.seed, 3), cfg.max_embedded_rows)
            ref_vecs, cur_vecs = _embed(embedder, ref_e, cur_e)
            embed_s = time.perf_counter() - t1
            embedding = _embedding_drift(ref_vecs, cur_vecs, cfg)
    t2 = time.perf_counter()

    informative = [d for d in descriptors if d.informative]
    share = sum(d.drifted for d in informative) / len(informative) if informative else (0.0 if descriptors else None)
    status, reason = _verdict(cfg, descriptors, share, embedding)
    reason = "; ".join([reason, *notes])
    timings = Timings(
        descriptors_s=t1 - t0, embedding_s=embed_s, embedding_drift_s=t2 - t1 - embed_s, total_s=t2 - started
    )
    return DriftReport(
        status=status,
        drifted=status == "drifted",
        reason=reason,
        descriptors=descriptors,
        drifted_share=share,
        embedding=embedding,
        seconds=timings,
        **base,
    )


def _order(n: int, seed: int, stream: int) -> NDArray[np.int64]:
    return np.random.default_rng([seed, stream]).permutation(n)


def _pick(texts: list[str], order: NDArray[np.int64], k: int) -> list[str]:
    """The first ``k`` of a seeded permutation, in their original order."""
    return texts if len(texts) <= k else [texts[i] for i in np.sort(order[:k])]


def _distinct(texts: list[str]) -> list[str]:
    return list(dict.fromkeys(texts))


def _descriptor_drift(ref: list[str], cur: list[str], cfg: DriftConfig) -> list[DescriptorDrift]:
    import pandas as pd
    from evidently import DataDefinition, Dataset, Report
    from evidently.descriptors import NonLetterCharacterPercentage, TextLength, TextMatch, WordCount
    from evidently.metrics import ValueDrift

    numeric = {
        "length": lambda: TextLength(_TEXT, alias="length"),
        "word_count": lambda: WordCount(_TEXT, alias="word_count"),
        "non_letter_pct": lambda: NonLetterCharacterPercentage(_TEXT, alias="non_letter_pct"),
    }
    made = [numeric[name]() for name in cfg.descriptors]
    made += [TextMatch(_TEXT, [p], match_type="regex", alias=_PATTERN_PREFIX + n) for n, p in cfg.patterns.items()]
    columns = list(cfg.descriptors) + [_PATTERN_PREFIX + n for n in cfg.patterns]
    if not columns:
        return []

    def dataset(texts: list[str]) -> Any:
        frame = pd.DataFrame({_TEXT: texts})
        return Dataset.from_pandas(frame, data_definition=DataDefinition(text_columns=[_TEXT]), descriptors=made)

    ref_ds, cur_ds = dataset(ref), dataset(cur)
    metrics = []
    for col in columns:
        pattern = col.startswith(_PATTERN_PREFIX)
        method = cfg.cat_stattest if pattern else cfg.num_stattest
        threshold = cfg.cat_threshold if pattern else cfg.num_threshold
        metrics.append(ValueDrift(column=col, method=method, threshold=threshold))
    snapshot = Report(metrics, include_tests=True).run(cur_ds, ref_ds)
    ref_df, cur_df = ref_ds.as_dataframe(), cur_ds.as_dataframe()
    by_column: dict[str, Any] = {}
    for result in snapshot.metric_results.values():
        params = result.metric_value_location.metric.params
        by_column[params["column"]] = (result, params)
    out = []
    for col in columns:
        result, params = by_column[col]
        pattern = col.startswith(_PATTERN_PREFIX)
        r_vals = ref_df[col].to_numpy(dtype=np.float64)
        c_vals = cur_df[col].to_numpy(dtype=np.float64)
        constant = r_vals.min() == r_vals.max() == c_vals.min() == c_vals.max()
        score = float(result.value)
        out.append(
            DescriptorDrift(
                name=col.removeprefix(_PATTERN_PREFIX) if pattern else col,
                kind="pattern" if pattern else "numerical",
                method=str(params["method"]),
                score_kind="p_value" if "p_value" in str(params["method"]) else "distance",
                score=score if math.isfinite(score) else None,
                threshold=float(params["threshold"]),
                drifted=any(str(t.status.value) == "FAIL" for t in result.tests) and not constant,
                informative=not constant,
                reference_mean=float(r_vals.mean()),
                current_mean=float(c_vals.mean()),
                histogram=None if pattern else _histogram(r_vals, c_vals, cfg.histogram_bins),
            )
        )
    return out


def _histogram(ref: NDArray[np.float64], cur: NDArray[np.float64], bins: int) -> Histogram:
    lo, hi = float(min(ref.min(), cur.min())), float(max(ref.max(), cur.max()))
    edges = np.linspace(lo, hi if hi > lo else lo + 1.0, bins + 1)
    shares = [np.histogram(v, edges)[0] / max(v.size, 1) for v in (ref, cur)]
    return Histogram(
        edges=[round(float(e), 4) for e in edges],
        reference=[round(float(s), 5) for s in shares[0]],
        current=[round(float(s), 5) for s in shares[1]],
    )


def _embed(embedder: Embedder, ref: list[str], cur: list[str]) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """Each distinct text embedded once, both sides in one call (so their vectors share one space)."""
    distinct = list(dict.fromkeys([*ref, *cur]))
    vectors = np.asarray(embedder.encode(distinct), dtype=np.float64)
    if vectors.ndim != 2 or vectors.shape[0] != len(distinct):
        raise ValueError(f"the embedder returned shape {vectors.shape} for {len(distinct)} texts")
    row = {text: i for i, text in enumerate(distinct)}
    return vectors[[row[t] for t in ref]], vectors[[row[t] for t in cur]]


def _embedding_drift(ref: NDArray[np.float64], cur: NDArray[np.float64], cfg: DriftConfig) -> EmbeddingDrift:
    import pandas as pd
    from evidently.legacy.metrics.data_drift.embedding_drift_methods import (
        DistanceDriftMethod,
        DriftMethod,
        MMDDriftMethod,
        ModelDriftMethod,
        RatioDriftMethod,
    )

    bootstrap = cfg.embedding_bootstrap if cfg.embedding_bootstrap is not None else len(ref) < _BOOTSTRAP_BELOW
    kwargs: dict[str, Any] = {"pca_components": cfg.embedding_pca_components}
    if bootstrap and cfg.embedding_method in ("model", "distance"):  # mmd's bootstrap reads its own as a p-value
        kwargs["quantile_probability"] = cfg.embedding_quantile
    if cfg.embedding_threshold is not None:
        kwargs["threshold"] = cfg.embedding_threshold
    method: DriftMethod
    if cfg.embedding_method == "model":
        method = ModelDriftMethod(bootstrap=bootstrap, **kwargs)
    elif cfg.embedding_method == "distance":
        method = DistanceDriftMethod(bootstrap=bootstrap, **kwargs)
    elif cfg.embedding_method == "mmd":
        method = MMDDriftMethod(bootstrap=bootstrap, **kwargs)
    else:
        bootstrap = False  # the ratio method has no bootstrap
        method = RatioDriftMethod(**kwargs)
    names = [f"e{i}" for i in range(ref.shape[1])]
    # Evidently's bootstraps seed numpy's global generator (np.random.seed(i)): put the caller's state back after
    state = np.random.get_state()
    try:
        score, drifted, _ = method(pd.DataFrame(cur, columns=names), pd.DataFrame(ref, columns=names))
    finally:
        np.random.set_state(state)
    return EmbeddingDrift(
        method=cfg.embedding_method,
        score=float(score),
        threshold=None if bootstrap else float(method.threshold),
        bootstrap=bootstrap,
        drifted=bool(drifted),
        reference_rows=len(ref),
        current_rows=len(cur),
        dimensions=ref.shape[1],
        distinct=cfg.embed_distinct,
    )


def _verdict(
    cfg: DriftConfig, descriptors: list[DescriptorDrift], share: float | None, embedding: EmbeddingDrift | None
) -> tuple[Status, str]:
    views: dict[str, bool | None] = {"embeddings": None, "descriptors": None}
    parts = []
    if embedding is not None:
        views["embeddings"] = embedding.drifted
        bound = "bootstrap" if embedding.threshold is None else f"{embedding.threshold:g}"
        parts.append(f"embeddings {embedding.method} {embedding.score:.3f} vs {bound}: {said(embedding.drifted)}")
    if share is not None:
        informative = [d for d in descriptors if d.informative]
        drifted = [d.name for d in informative if d.drifted]
        views["descriptors"] = share >= cfg.drift_share
        named = f" ({', '.join(drifted)})" if drifted else ""
        parts.append(
            f"descriptors {len(drifted)}/{len(informative)} drifted{named}, share {share:.2f} vs {cfg.drift_share:g}: "
            f"{said(views['descriptors'])}"
        )
    emb, desc = views["embeddings"], views["descriptors"]
    wanted = {"either": (emb, desc), "both": (emb, desc), "embedding": (emb,), "descriptors": (desc,)}[cfg.rule]
    detail = f"rule {cfg.rule}; " + "; ".join(parts)
    known = [v for v in wanted if v is not None]
    if not known or (cfg.rule == "both" and len(known) < 2):
        return "inconclusive", f"nothing to judge by: {detail}"
    verdict = any(known) if cfg.rule == "either" else all(known)
    return ("drifted" if verdict else "no_drift"), detail


def said(drifted: bool | None) -> str:
    return "drift" if drifted else "no drift"
