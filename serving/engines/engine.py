"""Inference engines behind one Protocol: vLLM's ``AsyncLLM`` in this process, and what the gateway needs of it.

The gateway knows nothing of vLLM: it calls ``Engine.generate(GenerationRequest)`` and gets ``Delta``s (new text,
new token count, finish reason; log-probabilities when asked, for ``/v1/completions``), calls ``abort`` when a
client goes away, and reads ``state``/``queue_depth`` for readiness and brownout, ``vocab_size`` to validate
``logit_bias``. Unit tests use fakes implementing the same Protocol.

One ``VllmEngine`` per set of base weights: LoRA versions are adapters on their base's engine (``enable_lora``),
so champion, canary and shadow adapters cost one engine; a full fine-tune gets its own.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

from core.machine import BF16_ISA_CLASSES, isa_class
from core.quantized import compute_dtype
from serving.config import Dtype, EngineSettings
from serving.wire.errors import bad_request

log = logging.getLogger("lifecycle.serving")

# vLLM's Prometheus stat logger unregisters every ``vllm:*`` collector of the process-wide registry, then registers
# its own: two engines starting side by side (the router loads a base and a LoRA engine at once) can interleave the
# two steps and fail with DuplicateTimeseries. Only that construction is serialized, not the engines' starts.
_METRICS_LOCK = threading.Lock()


@functools.cache
def _serialized_prometheus_logger() -> type:
    """vLLM's ``PrometheusStatLogger``, built under a process-wide lock; handed to ``AsyncLLM`` as its stat logger
    (a subclass of vLLM's own, so vLLM adds no second one)."""
    from vllm.v1.metrics.loggers import PrometheusStatLogger

    class SerializedPrometheusStatLogger(PrometheusStatLogger):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            with _METRICS_LOCK:
                super().__init__(*args, **kwargs)

    return SerializedPrometheusStatLogger


EngineState = Literal["starting", "ready", "dead", "stopped"]


@dataclass(frozen=True)
class Adapter:
    """A LoRA adapter to apply on a base engine (vLLM needs a stable positive integer id per adapter)."""

    name: str
    id: int
    path: Path


@dataclass
class GenerationRequest:
    request_id: str
    prompt_token_ids: list[int]
    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    stop: Sequence[str] = ()
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[int, float] = field(default_factory=dict)
    adapter: Adapter | None = None
    logprobs: int | None = None  # top candidates per generated token (0: the sampled token's own only); None: off
    prompt_logprobs: int | None = None  # the same for every prompt token (the first has none); None: off
    json_schema: dict[str, Any] | None = None  # structured outputs: the text is JSON valid under it (tool calls)


@dataclass(frozen=True)
class TokenLogprob:
    """One token's log-probability, as the OpenAI completions API reports it: the token's text, its logprob, and
    the top candidates at that position (text -> logprob, the chosen token among them)."""

    token_id: int
    text: str
    logprob: float
    top: tuple[tuple[str, float], ...] = ()


@dataclass(frozen=True)
class Delta:
    text: str
    new_tokens: int
    finish_reason: str | None = None  # "stop", "length", "abort" on the last delta
    logprobs: tuple[TokenLogprob, ...] = ()  # one per new token, when the request asked for them
    prompt_logprobs: tuple[TokenLogprob | None, ...] | None = None  # on the first delta, when asked (first: None)


class EngineDead(RuntimeError):
    """The engine process is gone; requests must go elsewhere."""


class Tokenizer(Protocol):
    def apply_chat_template(self, conversation: Any, **kwargs: Any) -> Any: ...

    def encode(self, text: str, **kwargs: Any) -> list[int]: ...

    def decode(self, token_ids: Any, **kwargs: Any) -> str: ...


class Engine(Protocol):
    key: str  # identity of the weights it serves
    max_model_len: int
    vocab_size: int  # token ids are 0 .. vocab_size - 1 (logit_bias and token prompts are checked against it)
    tokenizer: Tokenizer

    @property
    def state(self) -> EngineState: ...

    @property
    def queue_depth(self) -> int:
        """Requests admitted but not yet past their first token."""
        ...

    @property
    def in_flight(self) -> int: ...

    def generate(self, request: GenerationRequest) -> AsyncIterator[Delta]: ...

    async def abort(self, request_id: str) -> None: ...

    def adapter_in_flight(self, adapter: Adapter) -> int:
        """Requests in flight that use ``adapter``."""
        ...

    async def remove_adapter(self, adapter: Adapter) -> None:
        """Unload an adapter no request uses any more (a retired canary or shadow); call on the event loop."""
        ...

    def shutdown(self) -> None: ...


def choose_dtype(requested: Dtype, *, cpu: bool, isa: str) -> Dtype:
    """``serving.engine.dtype`` as vLLM gets it: ``auto`` on a CPU picks bfloat16 only where the kernels compute in
    bf16 (``core.machine.isa_class``: a bf16 CPU, not held to AVX2 kernels; elsewhere bf16 is emulated, and slower
    than float32); everything else passes through."""
    if requested != "auto" or not cpu:
        return requested
    return "bfloat16" if isa in BF16_ISA_CLASSES else "float32"


def engine_label(key: str) -> str:
    """A short, bounded name of an engine for metrics and logs: its kind and weights hash prefix, and the version it
    is dedicated to (``lora:61f5255c9d40``, ``full:61f5255c9d40#chat/3``); never a file path."""
    kind, _, rest = key.partition(":")
    weights, sep, dedicated = rest.partition("#")
    return f"{kind}:{weights[:12]}{sep}{dedicated}"


def engine_dtype(requested: Dtype) -> Dtype:
    from vllm.platforms import current_platform

    return choose_dtype(requested, cpu=current_platform.is_cpu(), isa=isa_class())


class VllmEngine:
    """``AsyncLLM`` with our bookkeeping. Construct with ``start`` (blocking, ~30 s on CPU: run it in a thread)."""

    def __init__(self, key: str, folder: Path, settings: EngineSettings, *, lora: bool) -> None:
        self.key = key
        self.folder = folder
        self.settings = settings
        self.lora = lora
        self._llm: Any = None
        self._state: EngineState = "starting"
        self._waiting: set[str] = set()
        self._running: set[str] = set()
        self._adapter_use: dict[int, int] = {}  # adapter id -> requests in flight with it
        self.max_model_len = 0
        self.vocab_size = 0
        self.tokenizer: Any = None
        self.started_s: float | None = None

    def start(self) -> VllmEngine:
        from vllm.config.structured_outputs import StructuredOutputsConfig
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        t0 = time.monotonic()
        s = self.settings
        args = AsyncEngineArgs(
            model=str(self.folder),
            dtype=compute_dtype(self.folder) or engine_dtype(s.dtype),  # quantized kernels: bf16 only
            max_num_seqs=s.max_num_seqs,
            enable_prefix_caching=s.enable_prefix_caching,
            enable_lora=self.lora,
            max_loras=s.max_loras,
            max_lora_rank=s.max_lora_rank,
            seed=s.seed,
            enforce_eager=s.enforce_eager,
            served_model_name=engine_label(self.key),  # vLLM labels its metrics with it: the folder path otherwise
            # tool calls as compact JSON (a model free to write whitespace in a grammar may write nothing else), on
            # xgrammar: the backend the gateway checks tool schemas with before a request reaches the engine
            structured_outputs_config=StructuredOutputsConfig(backend="xgrammar", disable_any_whitespace=True),
        )
        if s.max_model_len:
            args.max_model_len = s.max_model_len
        try:
            self._llm = AsyncLLM.from_engine_args(args, stat_loggers=[_serialized_prometheus_logger()])
        except Exception:
            self._state = "dead"
            raise
        self.max_model_len = int(self._llm.model_config.max_model_len)
        self.vocab_size = int(self._llm.model_config.get_vocab_size())
        self.tokenizer = self._llm.get_tokenizer()
        self.started_s = time.monotonic() - t0
        self._state = "ready"
        log.info("engine %s ready in %.1f s (%s)", self.key[:12], self.started_s, self.folder)
        return self

    @property
    def state(self) -> EngineState:
        if self._state == "ready" and self._llm is not None and self._llm.errored:
            self._state = "dead"
        return self._state

    @property
    def queue_depth(self) -> int:
        return len(self._waiting)

    @property
    def in_flight(self) -> int:
        return len(self._waiting) + len(self._running)

    @property
    def pids(self) -> list[int]:
        """Engine-core process ids (shown on /readyz; an operator or a test can find the process)."""
        manager = getattr(getattr(getattr(self._llm, "engine_core", None), "resources", None), "engine_manager", None)
        return [p.pid for p in getattr(manager, "processes", []) if p.pid is not None]

    async def generate(self, request: GenerationRequest) -> AsyncIterator[Delta]:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt
        from vllm.lora.request import LoRARequest
        from vllm.sampling_params import RequestOutputKind, StructuredOutputsParams
        from vllm.v1.engine.exceptions import EngineDeadError

        if self.state != "ready":
            raise EngineDead(f"engine {self.key[:12]} is {self.state}")
        params = SamplingParams(
            max_tokens=request.max_tokens,
            temperature=request.temperature,
            top_p=request.top_p,
            seed=request.seed,
            stop=list(request.stop) or None,
            presence_penalty=request.presence_penalty,
            frequency_penalty=request.frequency_penalty,
            logit_bias=request.logit_bias or None,
            logprobs=request.logprobs,
            prompt_logprobs=request.prompt_logprobs,
            output_kind=RequestOutputKind.DELTA,
            structured_outputs=(
                StructuredOutputsParams(json=request.json_schema, disable_any_whitespace=True)
                if request.json_schema
                else None
            ),
        )
        adapter = request.adapter
        lora = LoRARequest(adapter.name, adapter.id, str(adapter.path)) if adapter else None
        rid = request.request_id
        self._waiting.add(rid)
        if adapter is not None:
            self._adapter_use[adapter.id] = self._adapter_use.get(adapter.id, 0) + 1
        try:
            async for out in self._llm.generate(
                TokensPrompt(prompt_token_ids=request.prompt_token_ids), params, rid, lora_request=lora
            ):
                if rid in self._waiting:
                    self._waiting.discard(rid)
                    self._running.add(rid)
                piece = out.outputs[0]
                yield Delta(
                    piece.text,
                    len(piece.token_ids),
                    piece.finish_reason if out.finished else None,
                    _logprobs(piece.token_ids, piece.logprobs) if request.logprobs is not None else (),
                    _prompt_logprobs(out) if request.prompt_logprobs is not None else None,
                )
        except ValueError as exc:  # vLLM's input checks (a grammar its backend cannot build): the client's input
            if request.json_schema is None or rid in self._running:
                raise
            raise bad_request(f"the engine cannot follow the tools' schema: {exc}"[:500], param="tools") from None
        except EngineDeadError as exc:
            self._state = "dead"
            raise EngineDead(f"engine {self.key[:12]} died: {exc}") from exc
        finally:
            self._waiting.discard(rid)
            self._running.discard(rid)
            if adapter is not None:
                left = self._adapter_use.get(adapter.id, 1) - 1
                if left:
                    self._adapter_use[adapter.id] = left
                else:
                    self._adapter_use.pop(adapter.id, None)

    async def abort(self, request_id: str) -> None:
        if self._llm is not None and self.state == "ready":
            await self._llm.abort(request_id)

    def adapter_in_flight(self, adapter: Adapter) -> int:
        return self._adapter_use.get(adapter.id, 0)

    async def remove_adapter(self, adapter: Adapter) -> None:
        """``AsyncLLM.remove_lora``: frees the adapter's slot and its CPU cache entry. Called only once no request
        of ours uses it (the router checks ``adapter_in_flight``): vLLM would re-load an adapter a running request
        still names from its path on the next step, a wasted load rather than a failure. It must run on the loop
        that drives this engine's output handler (vLLM's utility calls resolve futures of that loop)."""
        if self._llm is not None and self.state == "ready":
            await self._llm.remove_lora(adapter.id)

    def shutdown(self) -> None:
        if self._llm is not None:
            self._llm.shutdown()
        self._state = "stopped"


def _token(token_id: int, candidates: Any) -> TokenLogprob:
    """One position of vLLM's logprobs (token id -> Logprob with its decoded text), the chosen token first."""
    chosen = candidates[token_id]
    top = tuple((lp.decoded_token or "", max(lp.logprob, -9999.0)) for lp in candidates.values())
    return TokenLogprob(token_id, chosen.decoded_token or "", max(chosen.logprob, -9999.0), top)


def _logprobs(token_ids: Sequence[int], logprobs: Any) -> tuple[TokenLogprob, ...]:
    return tuple(_token(t, logprobs[i]) for i, t in enumerate(token_ids)) if logprobs is not None else ()


def _prompt_logprobs(out: Any) -> tuple[TokenLogprob | None, ...] | None:
    """The prompt's logprobs, which vLLM sends with the first output of a request only."""
    if out.prompt_logprobs is None:
        return None
    return tuple(
        None if lp is None else _token(t, lp) for t, lp in zip(out.prompt_token_ids, out.prompt_logprobs, strict=False)
    )


async def close_stream(stream: AsyncIterator[Delta]) -> None:
    """Close an engine's delta stream now (an async generator left to the garbage collector keeps its request
    counted in flight until it is collected)."""
    aclose = getattr(stream, "aclose", None)
    if aclose is not None:
        await aclose()


async def drain(engine: Engine, request: GenerationRequest) -> tuple[str, int, str | None]:
    """Whole text, token count and finish reason of one request (tests and batch callers)."""
    text, tokens, finish = [], 0, None
    async for delta in engine.generate(request):
        text.append(delta.text)
        tokens += delta.new_tokens
        finish = delta.finish_reason or finish
    return "".join(text), tokens, finish
