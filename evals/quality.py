"""The quality suite through lm-evaluation-harness: our tasks (evals/tasks/, materialized with the eval set),
against a model folder (lm-eval's ``vllm`` model: batched, LoRA adapters as a ``LoRARequest``) or an
OpenAI-compatible URL (``local-chat-completions``: generative tasks only, the chat API has no prompt
loglikelihoods; ``local-completions``: every task, with the ``remove_whitespace`` filter our task already has).

Per-item scores come from lm-eval's logged samples, keyed by our item ids; values and standard errors are
computed from them (means and their standard error; bits per byte as a ratio with its delta-method error).
lm-eval's own stderr bootstrap is off: it forks a multiprocessing Pool, which can deadlock in a process that
already runs vLLM's threads (seen here: a hung eval).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Sequence
from typing import Any

from evals.config import QualitySuite
from evals.report import MetricResult, SuiteResult, mean_metric, weighted_value
from evals.sets import EvalSets

CHAT_API_TASKS = ("chat_exact",)  # what an OpenAI chat endpoint can answer (no prompt logprobs)
_LN2 = math.log(2)


def _spec(suite: QualitySuite, key: str) -> tuple[bool, str]:
    spec = suite.metrics[key]
    return spec.higher_is_better, spec.description


def _exact_metrics(suite: QualitySuite, results: dict[str, Any]) -> list[MetricResult]:
    samples = results["samples"]["chat_exact"]
    metrics = []
    for key, skill in [("exact_match", None), *((f"exact_match.{s}", s) for s in suite.skills)]:
        if key not in suite.metrics:
            continue
        items = {s["doc"]["id"]: float(s["exact_match"]) for s in samples if skill in (None, s["doc"]["skill"])}
        hib, desc = _spec(suite, key)
        metrics.append(mean_metric(f"{suite.name}/{key}", items, higher_is_better=hib, description=desc))
    return metrics


def _choice_metric(suite: QualitySuite, results: dict[str, Any]) -> MetricResult:
    items = {s["doc"]["id"]: float(s["acc"]) for s in results["samples"]["chat_choice"]}
    hib, desc = _spec(suite, "choice_acc")
    return mean_metric(f"{suite.name}/choice_acc", items, higher_is_better=hib, description=desc)


def _perplexity_metric(suite: QualitySuite, results: dict[str, Any]) -> MetricResult:
    """Bits per byte of the reference replies: per item -loglik / ln 2 / bytes, aggregated as the ratio of sums
    (bytes as weights), with the delta-method standard error of that ratio."""
    items, weights = {}, {}
    for s in results["samples"]["chat_perplexity"]:
        nbytes = float(len(s["doc"]["reply"].encode("utf-8")))
        items[s["doc"]["id"]] = -float(s["perplexity"]) / _LN2 / nbytes
        weights[s["doc"]["id"]] = nbytes
    keys = list(items)
    value = weighted_value(items, weights, keys)
    n = len(keys)
    stderr = None
    if n > 1:
        mean_w = sum(weights.values()) / n
        resid = [weights[k] * (items[k] - value) for k in keys]  # bits_k - value * bytes_k
        stderr = math.sqrt(sum(r * r for r in resid) / (n - 1) / n) / mean_w
    hib, desc = _spec(suite, "bits_per_byte")
    return MetricResult(
        name=f"{suite.name}/bits_per_byte",
        value=value,
        higher_is_better=hib,
        n=n,
        stderr=stderr,
        items=items,
        weights=weights,
        description=desc,
    )


def run_quality(suite: QualitySuite, sets: EvalSets, lm: Any, *, seed: int, chat_api: bool = False) -> SuiteResult:
    """Run the suite's lm-eval tasks on ``lm`` (an lm-eval ``LM``); ``chat_api`` limits them to generative ones."""
    import lm_eval
    from lm_eval.tasks import TaskManager

    start = time.perf_counter()
    tasks: Sequence[str] = [t for t in suite.tasks if t in CHAT_API_TASKS] if chat_api else suite.tasks
    logging.getLogger("lm_eval").setLevel(logging.WARNING)
    results = lm_eval.simple_evaluate(
        model=lm,
        tasks=list(tasks),
        task_manager=TaskManager(include_path=str(sets.tasks_dir), include_defaults=False),
        log_samples=True,
        apply_chat_template=True,
        bootstrap_iters=0,  # our stderrs come from the per-item scores; lm-eval's bootstrap forks a Pool
        random_seed=seed,
        numpy_random_seed=seed,
        torch_random_seed=seed,
        fewshot_random_seed=seed,
    )
    assert results is not None  # only None on non-zero ranks of a distributed run
    metrics: list[MetricResult] = []
    if "chat_exact" in tasks:
        metrics += _exact_metrics(suite, results)
    if "chat_choice" in tasks:
        metrics.append(_choice_metric(suite, results))
    if "chat_perplexity" in tasks:
        metrics.append(_perplexity_metric(suite, results))
    examples = [
        {"prompt": s["doc"]["prompt"], "target": s["doc"]["target"], "output": s["filtered_resps"][0]}
        for s in results["samples"].get("chat_exact", [])[:5]
    ]
    data = {name: sets.manifest["files"][name] for name in sets.manifest["files"] if name.startswith("quality_")}
    return SuiteResult.of(
        suite,
        start,
        data,
        metrics,
        {
            "tasks": list(tasks),
            "skipped_tasks": [t for t in suite.tasks if t not in tasks],
            "n": {t: len(results["samples"].get(t, [])) for t in tasks},
            "examples": examples,
        },
    )
