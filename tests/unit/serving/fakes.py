"""Hand-written fakes of the serving seams: a tokenizer, an ``Engine``, an engine factory, a ``VersionSource``, a
``ToxicityScorer`` and an ``Embedder``. Import them as ``from unit.serving.fakes import ...`` (pyproject puts
tests/ on the path).

    registry = FakeRegistry(tmp_path)
    registry.add_full("chat-base", "1", weights_hash="w-base")
    registry.add_lora("chat", "2", base="chat-base/1", aliases=("champion",))
    factory = FakeFactory(pieces=["Hel", "lo"])
    router = Router(registry, RoutingConfig(), "chat", factory)
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from core.errors import NotFoundError
from registry.store import CANARY_WEIGHT_TAG, Deployment, ModelVersion, parse_ref
from serving.engines.engine import Adapter, Delta, EngineDead, EngineState, GenerationRequest, TokenLogprob

# ------------------------------------------------------------------------------------------------------ tokenizer


class Clock:
    """A monotonic clock the test moves by hand (``clock.now += 2``)."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class FakeTokenizer:
    """A reversible word-level tokenizer with a toy chat template.

    ``apply_chat_template`` renders each message as ``<|role|> word ... <|end|>`` (so a message costs its
    whitespace-separated words + 2 tokens) and, with ``add_generation_prompt``, one more ``<|assistant|>`` token.
    Ids are stable per instance; ``decode`` turns them back into that text so tests can read what an engine got.
    """

    SPECIAL = ("<|system|>", "<|user|>", "<|assistant|>", "<|tool|>", "<|end|>")

    def __init__(self) -> None:
        self._ids: dict[str, int] = {tok: i + 1 for i, tok in enumerate(self.SPECIAL)}
        self._words: dict[int, str] = {i: tok for tok, i in self._ids.items()}
        self.renders = 0

    def _id(self, word: str) -> int:
        if word not in self._ids:
            self._ids[word] = len(self._ids) + 1
            self._words[self._ids[word]] = word
        return self._ids[word]

    def encode(self, text: str, **kwargs: Any) -> list[int]:
        return [self._id(w) for w in text.split()]

    def apply_chat_template(self, conversation: Any, **kwargs: Any) -> Any:
        self.renders += 1
        words: list[str] = []
        for m in conversation:
            words += [f"<|{m['role']}|>", *m["content"].split(), "<|end|>"]
        if kwargs.get("add_generation_prompt"):
            words.append("<|assistant|>")
        if not kwargs.get("tokenize", True):
            return " ".join(words)
        return [self._id(w) for w in words]

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = False) -> str:
        words = (self._words[i] for i in ids)
        return " ".join(w for w in words if not (skip_special_tokens and w in self.SPECIAL))

    @staticmethod
    def count(messages: Sequence[dict[str, str]], *, generation_prompt: bool = True) -> int:
        """Tokens ``apply_chat_template`` gives for these messages (words + 2 per message, + 1 for the prompt)."""
        return sum(len(m["content"].split()) + 2 for m in messages) + (1 if generation_prompt else 0)


# --------------------------------------------------------------------------------------------------------- engine


class FakeEngine:
    """An ``Engine`` that yields scripted deltas, with the same queue bookkeeping as ``VllmEngine``.

    ``pieces`` are yielded one per delta (``tokens_per_piece`` tokens each) and the last one carries
    ``finish_reason``; generation stops early with "length" once ``max_tokens`` tokens were produced.
    ``delay_s`` sleeps before every delta; ``gate`` and ``hold`` (events the test sets) are waited for before the
    first delta and before every later one: a request waiting for its first token, or still running, for exactly
    as long as a test needs, on any machine (no sleep to outlast); ``die_after`` (a delta
    count) makes the engine die mid-request, and ``extra_queue`` adds phantom waiting requests (to push
    ``queue_depth`` over a brownout threshold). Logprobs, when asked: each generated token gets logprob -0.25 * its
    position and one alternative ("<alt>", -3.0); each prompt token after the first -1.0.
    Per adapter (by name, like "chat/4"): ``adapter_pieces`` replaces ``pieces`` for its requests and
    ``failing_adapters`` makes its requests raise after the first delta. ``removed`` lists unloaded adapters.
    """

    def __init__(
        self,
        key: str = "fake",
        folder: Path | None = None,
        lora: bool = False,
        *,
        max_model_len: int = 512,
        tokenizer: FakeTokenizer | None = None,
        pieces: Sequence[str] = ("Hello", " there", "!"),
        finish_reason: str = "stop",
        tokens_per_piece: int = 1,
        delay_s: float = 0.0,
        die_after: int | None = None,
        vocab_size: int = 1000,
    ) -> None:
        self.key = key
        self.vocab_size = vocab_size
        self.gate: asyncio.Event | None = None
        self.hold: asyncio.Event | None = None
        self.folder = folder
        self.lora = lora
        self.max_model_len = max_model_len
        self.tokenizer = tokenizer or FakeTokenizer()
        self.pieces = list(pieces)
        self.finish_reason = finish_reason
        self.tokens_per_piece = tokens_per_piece
        self.delay_s = delay_s
        self.die_after = die_after
        self.extra_queue = 0
        self.adapter_pieces: dict[str, Sequence[str]] = {}
        self.failing_adapters: set[str] = set()
        self.removed: list[Adapter] = []
        self.requests: list[GenerationRequest] = []
        self.aborts: list[str] = []
        self.shutdowns = 0
        self._state: EngineState = "ready"
        self._waiting: set[str] = set()
        self._running: set[str] = set()
        self._by_adapter: dict[str, int] = {}  # rid -> adapter id

    @property
    def state(self) -> EngineState:
        return self._state

    @state.setter
    def state(self, value: EngineState) -> None:
        self._state = value

    @property
    def queue_depth(self) -> int:
        return len(self._waiting) + self.extra_queue

    @property
    def in_flight(self) -> int:
        return len(self._waiting) + len(self._running)

    async def generate(self, request: GenerationRequest) -> AsyncIterator[Delta]:
        if self._state != "ready":
            raise EngineDead(f"engine {self.key} is {self._state}")
        self.requests.append(request)
        rid = request.request_id
        self._waiting.add(rid)
        adapter = request.adapter.name if request.adapter else None
        if request.adapter is not None:
            self._by_adapter[rid] = request.adapter.id
        pieces = list(self.adapter_pieces.get(adapter, self.pieces)) if adapter else self.pieces
        produced = 0
        try:
            for i, piece in enumerate(pieces):
                if self.die_after is not None and i >= self.die_after:
                    self._state = "dead"
                    raise EngineDead(f"engine {self.key} died")
                if adapter in self.failing_adapters and i >= 1:
                    raise RuntimeError(f"adapter {adapter} failed on engine {self.key}")
                if self.delay_s:
                    await asyncio.sleep(self.delay_s)
                if self.gate is not None and i == 0:
                    await self.gate.wait()
                if self.hold is not None and i >= 1:
                    await self.hold.wait()
                self._waiting.discard(rid)
                self._running.add(rid)
                first = produced == 0
                produced += self.tokens_per_piece
                last = i == len(pieces) - 1
                extra: dict[str, Any] = {}
                if request.logprobs is not None:
                    extra["logprobs"] = tuple(self._logprob(piece, produced - k) for k in range(self.tokens_per_piece))
                if request.prompt_logprobs is not None and first:
                    extra["prompt_logprobs"] = self._prompt_logprobs(request.prompt_token_ids)
                if produced >= request.max_tokens and not last:
                    yield Delta(piece, self.tokens_per_piece, "length", **extra)
                    return
                yield Delta(piece, self.tokens_per_piece, self.finish_reason if last else None, **extra)
        finally:
            self._waiting.discard(rid)
            self._running.discard(rid)
            self._by_adapter.pop(rid, None)

    def _logprob(self, piece: str, position: int) -> TokenLogprob:
        value = -0.25 * position
        return TokenLogprob(self.vocab_size - position, piece, value, ((piece, value), ("<alt>", -3.0)))

    def _prompt_logprobs(self, ids: Sequence[int]) -> tuple[TokenLogprob | None, ...]:
        rest = [TokenLogprob(t, self.tokenizer.decode([t]), -1.0, ((self.tokenizer.decode([t]), -1.0),)) for t in ids]
        return (None, *rest[1:])

    async def abort(self, request_id: str) -> None:
        self.aborts.append(request_id)

    def adapter_in_flight(self, adapter: Adapter) -> int:
        return sum(1 for a in self._by_adapter.values() if a == adapter.id)

    async def remove_adapter(self, adapter: Adapter) -> None:
        assert self.adapter_in_flight(adapter) == 0, f"{adapter.name} removed while a request uses it"
        self.removed.append(adapter)

    def shutdown(self) -> None:
        self.shutdowns += 1
        self._state = "stopped"

    def prompts(self) -> list[str]:
        """The prompts this engine received, decoded."""
        return [self.tokenizer.decode(r.prompt_token_ids) for r in self.requests]


class FakeFactory:
    """An ``EngineFactory`` building ``FakeEngine``s; records every start and can be told to fail.

    ``engine_kwargs`` are passed to every engine it builds; ``fail_keys`` makes starting those keys raise.
    """

    def __init__(self, *, fail_keys: Iterable[str] = (), **engine_kwargs: Any) -> None:
        self.engine_kwargs = engine_kwargs
        self.fail_keys = set(fail_keys)
        self.starts: list[tuple[str, Path, bool]] = []
        self.engines: dict[str, FakeEngine] = {}

    def __call__(self, key: str, folder: Path, lora: bool) -> FakeEngine:
        self.starts.append((key, folder, lora))
        if key in self.fail_keys:
            raise RuntimeError(f"engine {key} failed to start")
        engine = FakeEngine(key, folder, lora, **self.engine_kwargs)
        self.engines[key] = engine
        return engine


# ------------------------------------------------------------------------------------------------------- registry


@dataclass
class FakeRegistry:
    """A ``VersionSource`` over folders under ``root``: ``root/NAME/VERSION`` holds a version's files.

    A LoRA version's folder has an ``adapter_config.json`` (what the router looks for) and the tags
    ``lineage.base_model`` / ``lineage.weights_hash``; a full version has a ``config.json``. Aliases live in
    ``aliases`` (name -> alias -> version) and may be moved or removed between calls, as in the MLflow UI.
    """

    root: Path
    versions: dict[str, ModelVersion] = field(default_factory=dict)
    aliases: dict[str, dict[str, str]] = field(default_factory=dict)
    tags: dict[str, dict[str, str]] = field(default_factory=dict)  # registered-model tags (the canary weight)
    parsed: list[str] = field(default_factory=list)

    def add_full(
        self, name: str, version: str, *, weights_hash: str | None = None, aliases: Sequence[str] = ()
    ) -> ModelVersion:
        folder = self._folder(name, version)
        (folder / "config.json").write_text(json.dumps({"model_type": "llama"}))
        tags = {"lineage.weights_hash": weights_hash or f"w-{name}-{version}"}
        return self._add(name, version, tags, aliases)

    def add_lora(self, name: str, version: str, *, base: str | None, aliases: Sequence[str] = ()) -> ModelVersion:
        folder = self._folder(name, version)
        (folder / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 8}))
        tags = {"lineage.weights_hash": f"w-{name}-{version}"}
        if base is not None:
            tags["lineage.base_model"] = base
        return self._add(name, version, tags, aliases)

    def set_alias(self, name: str, alias: str, version: str) -> None:
        self.aliases.setdefault(name, {})[alias] = version

    def remove_alias(self, name: str, alias: str) -> None:
        self.aliases.get(name, {}).pop(alias, None)

    def set_weight(self, name: str, percent: int) -> None:
        """The canary weight, as the rollout controller sets it (registered-model tag ``rollout.weight``)."""
        self.tags.setdefault(name, {})[CANARY_WEIGHT_TAG] = str(percent)

    def folder(self, ref: str) -> Path:
        mv = self.parse(ref)
        return self.root / mv.name / mv.version

    # --- VersionSource ---

    def parse(self, ref: str) -> ModelVersion:
        self.parsed.append(ref)
        name, alias, version = parse_ref(ref)
        if alias is not None:
            version = self.aliases.get(name, {}).get(alias)
            if version is None:
                raise NotFoundError(f"registered model {name!r} has no alias {alias!r}")
        mv = self.versions.get(f"{name}/{version}")
        if mv is None:
            raise NotFoundError(f"no registered version {name}/{version}")
        held = tuple(a for a, v in sorted(self.aliases.get(name, {}).items()) if v == mv.version)
        return ModelVersion(mv.name, mv.version, mv.run_id, mv.source, dict(mv.tags), held)

    def resolve(self, ref: str) -> Path:
        mv = self.parse(ref)
        return self.root / mv.name / mv.version

    def deployment(self, name: str) -> Deployment:
        return Deployment(name, dict(self.aliases.get(name, {})), dict(self.tags.get(name, {})))

    # --- internals ---

    def _folder(self, name: str, version: str) -> Path:
        folder = self.root / name / version
        folder.mkdir(parents=True, exist_ok=True)
        return folder

    def _add(self, name: str, version: str, tags: dict[str, str], aliases: Sequence[str]) -> ModelVersion:
        mv = ModelVersion(name, version, f"run-{name}-{version}", f"file://{self.root / name / version}", tags)
        self.versions[mv.ref] = mv
        for alias in aliases:
            self.set_alias(name, alias, version)
        return mv


# --------------------------------------------------------------------------------------------------------- scorer


class FakeScorer:
    """A ``ToxicityScorer``: 1.0 for a text containing a marker word, else 0.0; records every call."""

    name = "fake-toxicity"

    def __init__(self, markers: Sequence[str] = ("idiot",)) -> None:
        self.markers = tuple(m.lower() for m in markers)
        self.calls: list[list[str]] = []

    def score(self, texts: Sequence[str]) -> list[float]:
        self.calls.append(list(texts))
        return [1.0 if any(m in t.lower() for m in self.markers) else 0.0 for t in texts]


# ------------------------------------------------------------------------------------------------------- embedder


class FakeEmbedder:
    """A ``TokenizingEmbedder``: bag-of-words counts over a vocabulary grown as texts arrive (equal texts: cosine 1,
    no shared word: 0); ``fail`` makes ``encode`` raise. Records every call. A text is one token per word plus two
    (MiniLM's [CLS] and [SEP]); it reads at most ``MAX_TOKENS``."""

    name = "all-MiniLM-L6-v2"
    MAX_TOKENS = 16

    def count_tokens(self, texts: list[str]) -> list[int]:
        return [len(t.split()) + 2 for t in texts]

    def max_tokens(self) -> int:
        return self.MAX_TOKENS

    def __init__(self, *, fail: bool = False) -> None:
        self.fail = fail
        self.calls: list[list[str]] = []
        self._vocab: dict[str, int] = {}

    def encode(self, texts: list[str]) -> NDArray[np.float64]:
        self.calls.append(list(texts))
        if self.fail:
            raise RuntimeError("embedder unavailable")
        for text in texts:
            for word in text.lower().split():
                self._vocab.setdefault(word, len(self._vocab))
        out = np.zeros((len(texts), max(1, len(self._vocab))))
        for i, text in enumerate(texts):
            for word in text.lower().split():
                out[i, self._vocab[word]] += 1
        return out
