"""Run the eval suites against one target and return an ``EvalReport``.

    report = run_eval(cfg, ModelTarget(label="chat/3", model_id=weights_hash, folder=path), sets, suites)
    report = run_eval(cfg, UrlTarget(label="prod", base_url="http://127.0.0.1:8000/v1", model="chat"), ...)

One vLLM engine per model target serves every suite: lm-eval's ``vllm`` model builds it, and the behaviour
suites generate on the same ``LLM`` (with the same ``LoRARequest`` for adapter versions). The engine's
EngineCore process is shut down before returning, so evaluating several models in one process does not pile
up engines (each reserves ``VLLM_CPU_KVCACHE_SPACE`` GiB on CPU).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as pkg_version
from pathlib import Path
from typing import Any, Literal

from core.errors import ConfigError
from core.quantized import compute_dtype
from core.toxicity import ProfanityScorer, ToxicityScorer
from evals.behaviour import run_over_refusal, run_retention, run_safety, run_toxicity
from evals.config import EvalConfig, OverRefusalSuite, QualitySuite, RetentionSuite, SafetySuite, ToxicitySuite
from evals.generation import ChatModel, OpenAIChat, Screen, ScreenedChat, VllmChat
from evals.quality import run_quality
from evals.report import EvalReport, Screened, SuiteResult
from evals.sets import EvalSets, Suite


@dataclass(frozen=True)
class ModelTarget:
    """A local model: a full model folder, or a LoRA adapter folder served on its base folder."""

    label: str
    model_id: str
    folder: Path
    adapter: Path | None = None

    @property
    def lora_rank(self) -> int:
        if self.adapter is None:
            return 0
        return int(json.loads((self.adapter / "adapter_config.json").read_text(encoding="utf-8"))["r"])


@dataclass(frozen=True)
class UrlTarget:
    """Any OpenAI-compatible endpoint (our gateway, ``vllm serve``, a hosted API).

    ``api="chat"``: lm-eval's ``local-chat-completions`` (the server applies its chat template; generative tasks
    only, as the chat API returns no prompt loglikelihoods). ``api="completions"``: ``local-completions`` with
    the model's tokenizer (a local folder) rendering the chat template here and sending token ids; every task
    runs, loglikelihoods from ``echo`` + ``logprobs``, generations through our tasks' whitespace-stripping
    filter."""

    label: str
    base_url: str
    model: str
    api_key: str = "EMPTY"
    concurrency: int = 8
    api: Literal["chat", "completions"] = "chat"
    tokenizer: str | None = None

    @property
    def model_id(self) -> str:
        return f"{self.base_url}#{self.model}"


Target = ModelTarget | UrlTarget


def _vllm_release() -> str:
    """The installed vLLM release: the CPU build is distributed as ``vllm-cpu`` (pyproject.toml's ``cpu`` extra),
    the CUDA build as ``vllm`` (the ``gpu`` extra); same package, same version numbers."""
    try:
        return pkg_version("vllm")
    except PackageNotFoundError:
        return pkg_version("vllm-cpu")


def _lm_eval_vllm_class() -> Any:
    """lm-eval's ``vllm`` model class. It checks ``importlib.metadata.version("vllm")`` at import and in its
    constructor, but the CPU build is distributed as ``vllm-cpu`` (same package, same version numbers): the
    module is imported with a ``version`` that answers for ``vllm`` as vLLM's platform detection does
    (``<vllm-cpu version>+cpu``), and binds it for good."""
    import importlib.metadata as md

    real = md.version

    def version(name: str) -> str:
        if name == "vllm":
            try:
                return real("vllm")
            except md.PackageNotFoundError:  # vLLM's own platform check spells it this way too
                return real("vllm-cpu") + "+cpu"
        return real(name)

    md.version = version  # type: ignore[assignment]
    try:
        from lm_eval.models.vllm_causallms import VLLM
    finally:
        md.version = real
    return VLLM


@contextmanager
def _vllm_lm(cfg: EvalConfig, target: ModelTarget) -> Iterator[tuple[Any, ChatModel]]:
    VLLM = _lm_eval_vllm_class()  # noqa: N806
    kwargs: dict[str, Any] = {
        "pretrained": str(target.folder),
        "dtype": compute_dtype(target.folder) or cfg.engine.dtype,  # a quantized folder runs in bf16
        "seed": cfg.seed,
        "batch_size": "auto",
        "max_model_len": cfg.engine.max_model_len,
        "max_num_seqs": cfg.engine.max_num_seqs,
        "enforce_eager": cfg.engine.enforce_eager,
        "enable_prefix_caching": True,
    }
    if target.adapter is not None:
        kwargs |= {"lora_local_path": str(target.adapter), "max_lora_rank": max(8, target.lora_rank)}
    with engine_placement(in_process=cfg.engine.in_process):
        lm = VLLM(**kwargs)
        try:
            yield lm, VllmChat(lm.model, lm.lora_request)
        finally:
            lm.model.llm_engine.engine_core.shutdown()


@contextmanager
def chat_model(cfg: EvalConfig, target: ModelTarget) -> Iterator[VllmChat]:
    """A vLLM engine on ``target`` as a ``ChatModel`` with ``greedy`` (the eval engine's settings), shut down on
    exit."""
    with _vllm_lm(cfg, target) as (lm, _):
        yield VllmChat(lm.model, lm.lora_request)


@contextmanager
def engine_placement(*, in_process: bool) -> Iterator[None]:
    """Where vLLM's offline engine runs. By default vLLM starts an engine-core process, which starts a worker
    process; on CPU both are spawned and import vLLM and torch afresh: 35 s of a 2-core machine's time per
    engine, against 5 s in this process (the evaluating process has imported them already), with the same
    outputs (``benchmarks/eval_suites.py``). In this process, vLLM's CPU worker changes process-wide state, put
    back here when the engine is gone: it joins a torch.distributed group of one, may pin the process's threads to
    cores (children started later would inherit the pinning), replaces ``torch.set_num_threads`` with a no-op, and
    freezes vLLM's reading of environment variables.
    """
    if not in_process:
        yield
        return
    import torch

    saved_env = os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING")
    set_num_threads, threads = torch.set_num_threads, torch.get_num_threads()
    affinity = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    from vllm import envs

    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    envs.disable_envs_cache()  # an engine started before froze vLLM's reading of the environment
    try:
        yield
    finally:
        from vllm.distributed import cleanup_dist_env_and_memory

        cleanup_dist_env_and_memory()
        envs.disable_envs_cache()  # this engine froze it too
        torch.set_num_threads = set_num_threads
        torch.set_num_threads(threads)
        if affinity is not None:
            os.sched_setaffinity(0, affinity)
        if saved_env is None:
            os.environ.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)
        else:
            os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = saved_env


@contextmanager
def _api_lm(target: UrlTarget) -> Iterator[tuple[Any, ChatModel]]:
    from lm_eval.models.openai_completions import LocalChatCompletion, LocalCompletionsAPI

    # the key goes in the header: lm-eval's api_key property reads only $OPENAI_API_KEY, and ours differs per target
    common = {
        "model": target.model,
        "num_concurrent": target.concurrency,
        "max_retries": 3,
        "header": {"Authorization": f"Bearer {target.api_key}"},
    }
    lm: Any
    if target.api == "chat":
        url = target.base_url.rstrip("/") + "/chat/completions"
        lm = LocalChatCompletion(base_url=url, tokenized_requests=False, eos_string="<|end|>", **common)
    else:
        if not target.tokenizer:
            raise ConfigError("eval --api completions needs --tokenizer DIR (the served model's tokenizer folder)")
        url = target.base_url.rstrip("/") + "/completions"
        lm = LocalCompletionsAPI(
            base_url=url,
            tokenizer=target.tokenizer,
            tokenizer_backend="huggingface",
            tokenized_requests=True,  # False would send the chat as JSON messages, which /completions rejects
            **common,
        )
    yield lm, OpenAIChat(target.base_url, target.model, target.api_key, target.concurrency)


def _files(sets: EvalSets, name: str) -> dict[str, str]:
    return {name: sets.manifest["files"][name]}


def run_eval(
    cfg: EvalConfig,
    target: Target,
    sets: EvalSets,
    suites: Sequence[Suite],
    *,
    scorer: ToxicityScorer | None = None,
    on_suite: Any = None,
    screen: Screen | None = None,
) -> EvalReport:
    """Every suite on ``target``; ``on_suite(result)`` is called as each one finishes (progress). With ``screen``
    the chat suites ask the model behind it, as the endpoint serves it (``evals.as_served``)."""
    start = time.perf_counter()
    results: list[SuiteResult] = []
    screened: dict[str, dict[str, int]] = {}
    context = _vllm_lm(cfg, target) if isinstance(target, ModelTarget) else _api_lm(target)
    with context as (lm, model):
        chat: ChatModel = ScreenedChat(model, screen) if screen is not None else model
        for suite in suites:
            before = chat.counts() if isinstance(chat, ScreenedChat) else None
            if isinstance(suite, QualitySuite):
                chat_api = isinstance(target, UrlTarget) and target.api == "chat"
                result = run_quality(suite, sets, lm, seed=cfg.seed, chat_api=chat_api)
            elif isinstance(suite, ToxicitySuite):
                scorer = scorer or ProfanityScorer()
                rows = sets.rows("toxicity.jsonl")
                result = run_toxicity(suite, rows, chat, scorer, seed=cfg.seed, data=_files(sets, "toxicity.jsonl"))
            elif isinstance(suite, SafetySuite):
                rows = sets.rows("safety.jsonl")
                result = run_safety(suite, rows, chat, seed=cfg.seed, data=_files(sets, "safety.jsonl"))
            elif isinstance(suite, OverRefusalSuite):
                rows = sets.rows("over_refusal.jsonl")
                result = run_over_refusal(suite, rows, chat, seed=cfg.seed, data=_files(sets, "over_refusal.jsonl"))
            elif isinstance(suite, RetentionSuite):
                rows = sets.rows("retention.jsonl")
                result = run_retention(suite, rows, chat, seed=cfg.seed, data=_files(sets, "retention.jsonl"))
            if isinstance(chat, ScreenedChat) and before is not None and chat.seen > before["asked"]:
                screened[suite.name] = {k: v - before[k] for k, v in chat.counts().items()}
            results.append(result)
            if on_suite is not None:
                on_suite(result)
    versions = {
        "lm_eval": pkg_version("lm_eval"),
        "vllm": _vllm_release() if isinstance(target, ModelTarget) else "",
        "toxicity_scorer": (scorer.name if scorer else ""),
    }
    return EvalReport(
        model=target.label,
        model_id=target.model_id,
        eval_sets=sets.hash,
        snapshot=sets.manifest["snapshot"],
        seed=cfg.seed,
        created_at=datetime.now(UTC).isoformat(timespec="seconds"),
        seconds=time.perf_counter() - start,
        versions=versions,
        suites=results,
        served=Screened(filters=screen.identity, suites=screened) if screen is not None else None,
    )
