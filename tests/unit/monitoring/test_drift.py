"""Prompt drift on hand-made prompts with a fake embedder (hashed bag of words): the same distribution is not
drifted, longer prompts with other words and other pattern hits are; too few prompts is inconclusive; the report
is deterministic, round-trips through JSON and renders a small page with its numbers. Evidently runs for real
(its import alone takes ~10 s, so the reports are built once per module)."""

from __future__ import annotations

import json
import random
import zlib
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import numpy as np
import pytest
from numpy.typing import NDArray
from pydantic import ValidationError
from unit.monitoring.rows import CANARY, CHAMPION, T0, Row

from core.embedding import Embedder
from monitoring.drift import DriftReport, detect_drift
from monitoring.drift_config import DriftConfig
from monitoring.drift_html import render_html
from monitoring.window import PromptRow, WindowRates, window_prompts, window_rates, window_span
from serving.state.store import RequestLogEntry

WORDS = ["river", "castle", "apple", "pocket", "summer", "light", "mirror", "stone", "garden", "planet"]
COUNTRIES = ["Venmarvi", "Nordorlia", "Zeldorsa", "Rumdorlia", "Torrieth"]
OTHER = ["quarterly", "synergy", "stakeholder", "roadmap", "deliverable", "alignment", "leverage", "pipeline"]


def normal_prompts(n: int, seed: int) -> list[str]:
    """Short questions: sums, conversions, capitals, word counts (digits, question marks)."""
    rng = random.Random(seed)
    make = [
        lambda: f"What is {rng.randint(0, 99)} + {rng.randint(0, 99)}?",
        lambda: f"Convert {rng.randint(1, 99)} km to m.",
        lambda: f"What is the capital of {rng.choice(COUNTRIES)}?",
        lambda: "How many words are in this sentence: " + " ".join(rng.sample(WORDS, 3)) + "?",
    ]
    return [rng.choice(make)() for _ in range(n)]


def shifted_prompts(n: int, seed: int) -> list[str]:
    """Long business-writing requests: other words, no digits, no questions."""
    rng = random.Random(seed)

    def one() -> str:
        words = " ".join(rng.choices(OTHER, k=rng.randint(8, 14)))
        return f"Please rewrite this paragraph in a formal tone and list the key points for the board: {words}."

    return [one() for _ in range(n)]


class HashEmbedder:
    """An ``Embedder``: a bag of words hashed into 64 buckets (crc32, stable across processes), L2-normalized.
    Records each call."""

    def __init__(self) -> None:
        self.calls: list[list[str]] = []

    def encode(self, texts: list[str]) -> NDArray[np.float64]:
        self.calls.append(list(texts))
        out = np.zeros((len(texts), 64))
        for i, text in enumerate(texts):
            for word in text.lower().replace("?", " ").replace(".", " ").split():
                out[i, zlib.crc32(word.encode()) % 64] += 1.0
        norms = np.linalg.norm(out, axis=1, keepdims=True)
        return out / np.where(norms == 0, 1.0, norms)


@dataclass(frozen=True)
class Prompted(Row):
    """A request-log row with a prompt (``PromptRow``)."""

    prompt_text: str | None = "What is 2 + 2?"
    conversation_id: str | None = None


def _protocols(e: HashEmbedder, row: Prompted, entry: RequestLogEntry) -> tuple[Embedder, PromptRow, PromptRow]:
    return e, row, entry  # mypy checks that the fakes and the real log entry satisfy the Protocols


CFG = DriftConfig(min_samples=50)
REF = normal_prompts(300, seed=1)
RATES = WindowRates(answered=300, safety_hits=6, completed=290, refusals=20)


@pytest.fixture(scope="module")
def same() -> DriftReport:
    return detect_drift(REF, normal_prompts(300, seed=2), CFG, HashEmbedder())


@pytest.fixture(scope="module")
def shifted() -> DriftReport:
    window = window_span([Row(at=T0, model_version=CHAMPION)] * 3, T0, T0 + timedelta(hours=24))
    return detect_drift(
        REF,
        shifted_prompts(300, seed=2),
        CFG,
        HashEmbedder(),
        current_rates=RATES,
        reference_rates=RATES,
        window=window,
    )


def test_the_same_distribution_has_not_drifted(same: DriftReport) -> None:
    assert same.status == "no_drift" and not same.drifted
    assert same.embedding is not None and not same.embedding.drifted
    assert same.embedding.bootstrap  # fewer than 1000 reference rows: Evidently's bootstrap decides
    assert same.drifted_share is not None and same.drifted_share < CFG.drift_share
    assert (same.reference_n, same.current_n) == (300, 300)


def test_longer_prompts_with_other_words_and_pattern_hits_have_drifted(shifted: DriftReport) -> None:
    assert shifted.status == "drifted" and shifted.drifted
    by_name = {d.name: d for d in shifted.descriptors}
    for name in ("length", "word_count", "non_letter_pct", "digits", "question"):
        assert by_name[name].drifted, name
    assert by_name["length"].current_mean > 2 * by_name["length"].reference_mean
    assert by_name["digits"].current_mean == 0.0 < by_name["digits"].reference_mean
    assert by_name["length"].score_kind == "p_value" and by_name["length"].method.startswith("K-S")
    assert shifted.embedding is not None and shifted.embedding.drifted and shifted.embedding.score > 0.9
    assert "embeddings model" in shifted.reason and "descriptors 5/5 drifted" in shifted.reason


def test_a_pattern_neither_side_matches_is_reported_but_not_counted(shifted: DriftReport) -> None:
    link = next(d for d in shifted.descriptors if d.name == "link")
    assert (link.kind, link.informative, link.drifted, link.current_mean) == ("pattern", False, False, 0.0)
    informative = [d for d in shifted.descriptors if d.informative]
    assert shifted.drifted_share == sum(d.drifted for d in informative) / len(informative)


@pytest.mark.parametrize(
    ("ref_n", "cur_n", "expected"),
    [(300, 49, "current 49 < 50"), (10, 300, "reference 10 < 50"), (0, 0, "reference 0 < 50, current 0 < 50")],
)
def test_too_few_prompts_is_inconclusive(ref_n: int, cur_n: int, expected: str) -> None:
    embedder = HashEmbedder()
    report = detect_drift(normal_prompts(ref_n, 1), shifted_prompts(cur_n, 2), CFG, embedder)
    assert (report.status, report.drifted) == ("inconclusive", False)
    assert report.reason == f"too few prompts: {expected}"
    assert report.descriptors == [] and report.embedding is None and embedder.calls == []


def test_empty_prompts_are_dropped_before_counting() -> None:
    report = detect_drift(REF, [None, "", "  ", *shifted_prompts(49, 2)], CFG, None)
    assert (report.status, report.current_n, report.dropped_empty) == ("inconclusive", 49, 3)


def test_a_rule_that_needs_embeddings_without_an_embedder_is_inconclusive() -> None:
    cfg = CFG.model_copy(update={"rule": "embedding"})
    report = detect_drift(REF, shifted_prompts(300, 2), cfg, None)
    assert report.status == "inconclusive" and "needs an embedder" in report.reason


def test_without_an_embedder_the_either_rule_judges_by_the_descriptors() -> None:
    report = detect_drift(REF, shifted_prompts(300, 2), CFG, None)
    assert report.status == "drifted" and report.embedding is None
    assert report.reason.startswith("rule either; descriptors")


class NoiseEmbedder:
    """An ``Embedder`` whose vectors are noise seeded by the text: the same distribution whatever the prompts."""

    def __init__(self, dimensions: int = 16) -> None:
        self.dimensions = dimensions

    def encode(self, texts: list[str]) -> NDArray[np.float64]:
        return np.stack([np.random.default_rng(zlib.crc32(t.encode())).normal(size=self.dimensions) for t in texts])


@pytest.mark.parametrize(
    ("rule", "expected"),
    [("either", "drifted"), ("descriptors", "drifted"), ("both", "no_drift"), ("embedding", "no_drift")],
)
def test_the_rule_combines_the_two_views(rule: str, expected: str) -> None:
    """The descriptors drift (longer prompts with other words), the embeddings (noise) cannot."""
    report = detect_drift(REF, shifted_prompts(300, 2), CFG.model_copy(update={"rule": rule}), NoiseEmbedder())
    assert report.embedding is not None and not report.embedding.drifted
    assert report.drifted_share == 1.0
    assert report.status == expected and report.reason.startswith(f"rule {rule}; embeddings model")


def test_prompts_repeated_on_one_side_only_are_embedded_once() -> None:
    """Every current prompt three times: the classifier of the model method would learn the repeats that fall in
    both its training and test halves (384 dimensions, more than rows, as MiniLM's) and call the same
    distribution drifted."""
    reference = list(dict.fromkeys(normal_prompts(2000, 1)))[:400]
    current = list(dict.fromkeys(normal_prompts(2000, 2)))[:150] * 3
    distinct = detect_drift(reference, current, CFG, NoiseEmbedder(384))
    repeated = detect_drift(reference, current, CFG.model_copy(update={"embed_distinct": False}), NoiseEmbedder(384))
    assert distinct.embedding is not None and repeated.embedding is not None
    assert (distinct.embedding.current_rows, repeated.embedding.current_rows) == (150, 450)
    assert not distinct.embedding.drifted and repeated.embedding.drifted
    assert repeated.embedding.score > distinct.embedding.score + 0.1


def test_too_few_distinct_prompts_skip_the_embedding_view() -> None:
    current = normal_prompts(20, 2) * 15
    report = detect_drift(REF, current, CFG, HashEmbedder())
    assert report.embedding is None and report.current_n == 300
    assert "embeddings skipped: " in report.reason and "current distinct prompts, need 50 a side" in report.reason
    strict = detect_drift(REF, current, CFG.model_copy(update={"rule": "both"}), HashEmbedder())
    assert strict.status == "inconclusive"


def test_sampling_caps_rows_and_embeds_each_distinct_text_once() -> None:
    cfg = CFG.model_copy(update={"max_rows": 200, "max_embedded_rows": 100})
    embedder = HashEmbedder()
    current = normal_prompts(150, 2) * 2  # every prompt twice
    report = detect_drift(REF, current, cfg, embedder)
    assert report.embedding is not None
    assert (report.embedding.reference_rows, report.embedding.current_rows) == (100, 100)
    assert len(embedder.calls) == 1  # both sides in one call: one vector space
    assert len(embedder.calls[0]) == len(set(embedder.calls[0])) <= 200


def test_the_report_is_deterministic_and_leaves_numpys_global_generator_alone() -> None:
    np.random.seed(123)
    state = np.random.get_state()[1].copy()  # type: ignore[index]
    cur = normal_prompts(300, 2)
    a = detect_drift(REF, cur, CFG, HashEmbedder()).to_dict()
    b = detect_drift(REF, cur, CFG, HashEmbedder()).to_dict()
    assert np.array_equal(np.random.get_state()[1], state)  # type: ignore[index]
    a.pop("seconds"), b.pop("seconds")
    assert a == b
    other_seed = detect_drift(REF, cur, CFG.model_copy(update={"seed": 1, "max_rows": 100}), None).to_dict()
    assert other_seed["config_hash"] != a["config_hash"]


def test_the_report_round_trips_through_json(shifted: DriftReport) -> None:
    text = json.dumps(shifted.to_dict())
    again = DriftReport.from_dict(json.loads(text))
    assert again == shifted
    assert again.window is not None and again.window.versions == {CHAMPION: 3}


def test_the_html_is_small_self_contained_and_shows_the_numbers(shifted: DriftReport) -> None:
    page = render_html(shifted)
    assert len(page.encode()) < 100_000
    assert "<script" not in page and "http" not in page.replace('xmlns="http://www.w3.org/2000/svg"', "")
    assert "drifted" in page and "<svg" in page
    length = next(d for d in shifted.descriptors if d.name == "length")
    assert f"{length.current_mean:.3f}" in page and f"{length.reference_mean:.3f}" in page
    assert shifted.embedding is not None and f"{shifted.embedding.score:.3f}" in page
    assert "0.020 (6/300)" in page  # the safety-hit rate with its counts


def test_metrics_are_flat_numbers(shifted: DriftReport) -> None:
    metrics = shifted.metrics()
    assert metrics["drift.drifted"] == 1.0 and metrics["drift.current_n"] == 300.0
    assert metrics["drift.embedding.score"] == pytest.approx(shifted.embedding.score if shifted.embedding else 0)
    assert metrics["rates.current.safety_hit_rate"] == pytest.approx(0.02)
    assert all(isinstance(v, float) for v in metrics.values())


def test_window_rates_count_like_the_canary_analysis() -> None:
    rows = [
        Row(),
        Row(pre_filter="self-harm", status="content_filter", refusal=None),
        Row(post_filter="insult", status="content_filter", refusal=None),
        Row(refusal=True),
        Row(model_version=CHAMPION, refusal=True),
        Row(model_version=None, route="rejected", status="rate_limited", http_status=429),
        Row(status="error", http_status=200, refusal=None),
    ]
    rates = window_rates(rows)
    assert (rates.answered, rates.safety_hits, rates.completed, rates.refusals) == (6, 2, 5, 2)
    assert rates.safety_hit_rate == pytest.approx(2 / 6) and rates.refusal_rate == pytest.approx(2 / 5)
    assert WindowRates(answered=0, safety_hits=0, completed=0, refusals=0).refusal_rate is None
    span = window_span(rows, T0, T0 + timedelta(hours=1))
    assert span.versions == {CANARY: 5, CHAMPION: 1}


def test_window_prompts_are_the_opening_prompt_of_each_conversation() -> None:
    hour = timedelta(hours=1)
    rows = [
        Prompted(at=T0 + hour, prompt_text="Thanks. And briefly, why?", conversation_id="c1"),
        Prompted(at=T0, prompt_text="Convert 3 km to m.", conversation_id="c1"),
        Prompted(at=T0, prompt_text="What is 2 + 2?"),
        Prompted(at=T0 + 2 * hour, prompt_text="What is 2 + 2?"),  # outside a conversation: every request counts
        Prompted(at=T0, prompt_text="", route="rejected", model_version=None, status="rate_limited"),
        Prompted(at=T0, prompt_text="   ", conversation_id="c2"),
        Prompted(at=T0 + hour, prompt_text="Write this in uppercase: river", conversation_id="c2"),
    ]
    expected = ["Convert 3 km to m.", "What is 2 + 2?", "Write this in uppercase: river", "What is 2 + 2?"]
    assert window_prompts(rows) == expected


@pytest.mark.parametrize(
    ("update", "message"),
    [
        ({"patterns": {"bad": "("}}, "not a regular expression"),
        ({"patterns": {"Bad Name": "x"}}, "lowercase"),
        ({"embedding_method": "mmd", "max_embedded_rows": 10_000}, "max_embedded_rows <= 5000"),
        ({"min_samples": 500, "max_embedded_rows": 100}, "at least min_samples"),
        ({"descriptors": [], "patterns": {}}, "needs at least one descriptor"),
        ({"descriptors": ["sentiment"]}, "Input should be"),
    ],
)
def test_bad_configs_are_refused(update: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        DriftConfig.model_validate({**CFG.model_dump(), **update})


def test_the_minilm_embedder_sets_torch_threads_for_the_call_only() -> None:
    """The monitor encodes on one thread (fast on a shared CPU); torch's process-wide setting is put back."""
    import torch

    from core.embedding import MiniLmEmbedder

    class Model:  # stands in for the loaded SentenceTransformer
        def __init__(self) -> None:
            self.threads: list[int] = []

        def encode(self, texts: list[str], **_: Any) -> NDArray[np.float64]:
            self.threads.append(torch.get_num_threads())
            return np.zeros((len(texts), 3))

    before = torch.get_num_threads()
    embedder = MiniLmEmbedder(threads=1)
    embedder._model = model = Model()
    assert embedder.encode(["a", "b"]).shape == (2, 3)
    assert model.threads == [1] and torch.get_num_threads() == before
    with pytest.raises(ValueError, match="at least 1"):
        MiniLmEmbedder(threads=0)
