"""The shadow's parts on their own: the budget (concurrency, a sliding minute of tokens, reconciled to what was
used; never waits), the cosine, the fault configuration, and the real MiniLM embedder (slow: loads the model)."""

from __future__ import annotations

import numpy as np
import pytest
from pydantic import ValidationError
from unit.serving.fakes import Clock

from core.embedding import MiniLmEmbedder
from serving.config import FaultConfig, ServingConfig
from serving.pipeline.shadow import ShadowBudget, cosine


def test_budget_limits_concurrency_without_waiting() -> None:
    budget = ShadowBudget(max_concurrent=2, tokens_per_minute=10_000, clock=Clock())
    first, second = budget.acquire(10), budget.acquire(10)
    assert first is not None and second is not None
    assert budget.acquire(10) is None  # refused at once
    budget.release(first, 10)
    assert budget.acquire(10) is not None


def test_budget_tokens_per_minute_slide_and_reconcile() -> None:
    clock = Clock()
    budget = ShadowBudget(max_concurrent=10, tokens_per_minute=100, clock=clock)
    a = budget.acquire(60)
    assert a is not None
    assert budget.acquire(60) is None  # 120 > 100
    budget.release(a, 20)  # it used 20 of the 60 it reserved
    clock.now += 30
    b = budget.acquire(60)
    assert b is not None  # 20 + 60 <= 100
    assert budget.acquire(30) is None
    clock.now += 30.5  # a's minute is over
    assert budget.acquire(30) is not None  # 60 + 30
    assert budget.acquire(11) is None


def test_cosine() -> None:
    assert cosine(np.array([1.0, 0.0]), np.array([2.0, 0.0])) == pytest.approx(1.0)
    assert cosine(np.array([1.0, 0.0]), np.array([0.0, 3.0])) == pytest.approx(0.0)
    assert cosine(np.array([0.0, 0.0]), np.array([1.0, 0.0])) is None


@pytest.mark.parametrize("version", ["chat", "chat@champion", "chat/x", "/5"])
def test_a_fault_names_one_version(version: str) -> None:
    with pytest.raises(ValidationError, match="NAME/VERSION"):
        FaultConfig(version=version, ttft_delay_ms=10)


def test_serving_config_rollout_defaults() -> None:
    cfg = ServingConfig()
    assert (cfg.routing.challenger_alias, cfg.routing.shadow_alias, cfg.routing.refresh_s) == (
        "challenger",
        "shadow",
        10,
    )
    assert (cfg.shadow.enabled, cfg.shadow.fraction, cfg.shadow.max_concurrent) == (True, 0.25, 2)
    assert (cfg.shadow.tokens_per_minute, cfg.shadow.similarity, cfg.faults) == (20000, True, [])
    parsed = ServingConfig.model_validate({"faults": [{"version": "chat/5", "tpot_delay_ms": 30}]})
    assert parsed.faults[0].ttft_delay_ms == 0 and parsed.faults[0].tpot_delay_ms == 30


@pytest.mark.slow
def test_minilm_embedder_ranks_a_paraphrase_above_an_unrelated_answer() -> None:
    vectors = MiniLmEmbedder().encode(
        ["Paris is lovely in spring.", "In spring, Paris is beautiful.", "Install the package with pip."]
    )
    assert vectors.shape == (3, 384)
    close, far = cosine(vectors[0], vectors[1]), cosine(vectors[0], vectors[2])
    assert close is not None and far is not None and close > 0.8 > far
