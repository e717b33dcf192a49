"""Prompt drift with the real MiniLM embedder (the bundled all-MiniLM-L6-v2, on the CPU) and Evidently: the
reference is the training snapshot's prompts (the opening user prompt of each generated record, a seeded sample),
the current side the simulated users' prompts of ``flows.traffic``. Held-out ``normal`` traffic (the generator's
skill mix, prompts drawn from their own stream) must not be flagged; ``drifted`` traffic (long formatting requests
and provocations, no arithmetic) must be, by the embeddings as well as by the descriptors.

The model loads once per module (~15 s on a busy 2-core machine) and encodes on one thread; each distinct prompt
is embedded once for the module (the reference is shared); 300 prompts a side."""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from numpy.typing import NDArray

from core.embedding import MiniLmEmbedder
from flows.traffic import traffic_prompts
from monitoring.drift import DriftReport, detect_drift
from monitoring.drift_config import DriftConfig
from monitoring.drift_html import render_html
from training.config import GeneratorConfig
from training.data.synth import generate

N = 300
GEN = GeneratorConfig()
CFG = DriftConfig()


class Remembering:
    """The real embedder, each text embedded once (the tests share the reference)."""

    def __init__(self, inner: MiniLmEmbedder) -> None:
        self.inner = inner
        self.seen: dict[str, NDArray[np.floating[Any]]] = {}

    def encode(self, texts: list[str]) -> NDArray[np.floating[Any]]:
        new = [t for t in dict.fromkeys(texts) if t not in self.seen]
        if new:
            self.seen.update(zip(new, self.inner.encode(new), strict=True))
        return np.stack([self.seen[t] for t in texts])


@pytest.fixture(scope="module")
def embedder() -> Iterator[Remembering]:
    embedder = MiniLmEmbedder(threads=1)
    started = time.perf_counter()
    assert embedder.encode(["warm up"]).shape == (1, 384)
    print(f"MiniLM loaded in {time.perf_counter() - started:.1f} s")
    yield Remembering(embedder)


@pytest.fixture(scope="module")
def reference() -> list[str]:
    opening = [next(m["content"] for m in r["messages"] if m["role"] == "user") for r in generate(GEN)]
    return random.Random(0).sample(opening, N)


def _check(reference: list[str], current: list[str], embedder: Remembering) -> DriftReport:
    report = detect_drift(reference, current, CFG, embedder)
    print(report.reason, report.seconds)
    return report


def test_held_out_normal_prompts_are_not_drifted(reference: list[str], embedder: Remembering) -> None:
    current = traffic_prompts(GEN, "normal", N, seed=1)
    assert len(set(current) & set(reference)) < N // 10  # held out: other prompts
    report = _check(reference, current, embedder)
    assert report.status == "no_drift", report.reason
    assert report.embedding is not None and not report.embedding.drifted
    assert report.embedding.dimensions == 384 and report.embedding.reference_rows == len(set(reference))


def test_drifted_profile_prompts_are_drifted(reference: list[str], embedder: Remembering) -> None:
    report = _check(reference, traffic_prompts(GEN, "drifted", N, seed=1), embedder)
    assert report.status == "drifted" and report.drifted
    assert report.embedding is not None and report.embedding.drifted, report.reason
    assert report.drifted_share is not None and report.drifted_share >= CFG.drift_share, report.reason
    by_name = {d.name: d for d in report.descriptors}
    assert by_name["digits"].drifted and by_name["digits"].current_mean < by_name["digits"].reference_mean
    assert len(render_html(report).encode()) < 100_000
