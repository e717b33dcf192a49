"""``POST /v1/completions`` on the live gateway: the official openai client's completions API and lm-eval's
``local-completions`` run against it unmodified, and the eval suites' ``--url`` mode with ``api="completions"``
runs every task through it (loglikelihood tasks included) on the fallback version chat/3."""

from __future__ import annotations

import math
import sqlite3
from typing import Any

import pytest
from support.gateway_helpers import Gateway

PROMPT = "The capital of Karlo is"


def test_the_openai_client_completes_streams_and_echoes(gateway: Gateway) -> None:
    client = gateway.client()
    raw = client.completions.with_raw_response.create(model="chat/3", prompt=PROMPT, max_tokens=12, temperature=0)
    whole = raw.parse()
    assert raw.headers["x-model-version"] == "chat/3; alias=previous-champion"
    assert whole.object == "text_completion" and whole.id == raw.headers["x-request-id"]
    assert whole.usage is not None and 0 < whole.usage.completion_tokens <= 12
    streamed = client.completions.create(model="chat/3", prompt=PROMPT, max_tokens=12, temperature=0, stream=True)
    text = "".join(c.choices[0].text for c in streamed if c.choices)
    assert text == whole.choices[0].text  # greedy: the same completion, streamed
    echoed = client.completions.create(model="chat/3", prompt=PROMPT, max_tokens=0, echo=True, logprobs=2)
    choice = echoed.choices[0]
    assert choice.text == PROMPT and choice.logprobs is not None
    tokens, logprobs = choice.logprobs.tokens or [], choice.logprobs.token_logprobs or []
    assert len(tokens) == len(logprobs) == echoed.usage.prompt_tokens  # type: ignore[union-attr]
    assert logprobs[0] is None and all(lp is not None and lp <= 0 for lp in logprobs[1:])
    assert "".join(tokens).endswith(PROMPT)  # the prompt's tokens (after its begin-of-text token)


def test_echoed_prompt_logprobs_line_up_with_generated_ones(gateway: Gateway, tiny_base_model: Any) -> None:
    """The logprob of a prompt token, echoed, is the one the engine gives that token when it generates it after
    the same prefix: greedily generate one token after a prefix, then score prefix + that token with echo (an
    off-by-one between prompt positions and logprobs would be far off)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_base_model.path))
    client = gateway.client()
    prefix = tok(PROMPT)["input_ids"]
    step = client.completions.create(model="chat/3", prompt=prefix, max_tokens=1, temperature=0, logprobs=5)
    lp = step.choices[0].logprobs
    assert lp is not None and lp.tokens and lp.token_logprobs and lp.top_logprobs
    token, logprob = lp.tokens[0], lp.token_logprobs[0]
    assert logprob == pytest.approx(max(lp.top_logprobs[0].values()))  # greedy: the most likely token
    candidates = [i for i in range(len(tok)) if tok.decode([i]) == token]
    assert candidates, token
    scored = []
    for token_id in candidates:
        echo = client.completions.create(
            model="chat/3", prompt=[*prefix, token_id], max_tokens=0, echo=True, logprobs=0, temperature=0
        )
        assert echo.choices[0].logprobs is not None and echo.choices[0].logprobs.token_logprobs is not None
        scored.append(echo.choices[0].logprobs.token_logprobs[-1])
    assert any(s == pytest.approx(logprob, abs=0.02) for s in scored), (logprob, scored)


def test_every_eval_task_runs_through_the_completions_api(
    gateway: Gateway, tiny_snapshot: Any, tiny_base_model: Any, tmp_path: Any
) -> None:
    from evals.config import EvalConfig, load_suite
    from evals.runner import UrlTarget, run_eval
    from evals.sets import build_eval_sets

    quality = load_suite("quality").model_copy(update={"items_per_skill": 2, "conversations": 4})
    safety = load_suite("safety").model_copy(update={"per_category": 1})
    over_refusal = load_suite("over_refusal").model_copy(update={"prompts": 4})
    suites = [quality, safety, over_refusal]
    sets = build_eval_sets(tiny_snapshot, gateway.config.data.generator, suites, seed=1, root=tmp_path)
    target = UrlTarget(
        label="gateway",
        base_url=gateway.base_url,
        model="chat/3",
        api_key=gateway.eval_key,
        api="completions",
        tokenizer=str(tiny_base_model.path),  # chat/3 is a full copy of the base
    )
    report = run_eval(EvalConfig(), target, sets, suites)
    q = next(s for s in report.suites if s.name == "quality")
    assert q.details["skipped_tasks"] == [] and q.details["tasks"] == ["chat_exact", "chat_choice", "chat_perplexity"]
    metrics = report.metrics()
    assert len(metrics["quality/exact_match"].items) == 2 * len(quality.skills)
    assert metrics["quality/choice_acc"].n > 0 and metrics["quality/choice_acc"].n == len(
        metrics["quality/choice_acc"].items
    )
    assert math.isfinite(metrics["quality/bits_per_byte"].value) and metrics["quality/bits_per_byte"].value > 0
    assert "safety/refusal_rate" in metrics and "over_refusal/compliance_rate" in metrics
    with sqlite3.connect(gateway.home.serving / "serving.db") as con:
        completions = con.execute(
            "select count(*) from request_log where request_id like 'cmpl-%' and status = 'ok' and key_id = "
            "(select id from api_keys where name = 'evals')"
        ).fetchone()[0]
    assert completions >= len(metrics["quality/choice_acc"].items)  # the loglikelihoods went through the gateway
