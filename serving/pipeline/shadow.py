"""Shadow traffic: a share of the served name's requests is mirrored to the ``shadow`` version, and the two answers
are compared into the shadow log. The shadow never answers a user.

    mirror = ShadowMirror(cfg.shadow, store, scorer, metrics, faults, MiniLmEmbedder())
    run = mirror.start(request_id, started, "chat/4", generation_request, route.shadow)   # None: not mirrored
    ...                                                   # the user's answer is generated as usual
    run.primary_finished(PrimaryResult(text, tokens, "ok", ttft_ms, e2e_ms))               # in Gateway.finish

Which requests: those of the served name answered on the ok path (not pre-filter blocked, no brownout, no
fallback), chosen by a salted hash of the request id (``split.sampled``: ``shadow.fraction`` of them), while the
shadow budget allows: fewer than ``max_concurrent`` shadows running and ``tokens_per_minute`` not spent (prompt +
max_tokens reserved, reconciled to what was generated). A request over budget is skipped and counted, never
queued: the shadow must not add load the user pays for.

How: a background asyncio task sends the same prompt token ids and sampling parameters to the shadow version
(its own request id, ``<id>-shadow``), collects its text in memory, waits for the user's answer to finish, and
compares them off the event loop: length ratio, refusal (``core.refusal``), toxicity (the gateway's scorer),
embedding similarity (``core.embedding.Embedder``; the bundled all-MiniLM-L6-v2, loaded on first use in a worker
thread). The comparison row holds no text. The task is never awaited by the request, its failure is logged and
counted and never reaches the user, and it is cancelled (the engine request aborted) at shutdown.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

import anyio
import numpy as np
from numpy.typing import NDArray

from core.embedding import Embedder
from core.embedding import MiniLmEmbedder as MiniLmEmbedder  # re-exported: the gateway builds it from here
from core.embedding import TokenizingEmbedder as TokenizingEmbedder
from core.refusal import is_refusal
from core.toxicity import ToxicityScorer
from serving.config import ShadowConfig
from serving.engines import split
from serving.engines.engine import GenerationRequest, close_stream
from serving.engines.faults import Faults
from serving.engines.router import ServedModel
from serving.pipeline.metrics import ServingMetrics
from serving.state.store import ServingStore, ShadowLogEntry

log = logging.getLogger("lifecycle.serving")
BUDGET_WINDOW_S = 60.0


def cosine(a: NDArray[np.floating[Any]], b: NDArray[np.floating[Any]]) -> float | None:
    norm = float(np.linalg.norm(a) * np.linalg.norm(b))
    return float(np.dot(a, b) / norm) if norm > 0 else None


@dataclass(frozen=True)
class PrimaryResult:
    """The user's answer, as the shadow comparison needs it (handed over by ``Gateway.finish``)."""

    text: str
    tokens: int
    status: str
    ttft_ms: float | None
    e2e_ms: float


class ShadowBudget:
    """Concurrency and tokens/minute of the shadow: ``acquire`` reserves or refuses at once, never waits."""

    def __init__(self, max_concurrent: int, tokens_per_minute: int, clock: Callable[[], float] = time.monotonic):
        self.max_concurrent = max_concurrent
        self.tokens_per_minute = tokens_per_minute
        self.clock = clock
        self.running = 0
        self._spent: deque[list[float]] = deque()  # [time, tokens] per mirrored request of the last minute

    def acquire(self, tokens: int) -> list[float] | None:
        now = self.clock()
        while self._spent and self._spent[0][0] <= now - BUDGET_WINDOW_S:
            self._spent.popleft()
        if self.running >= self.max_concurrent:
            return None
        if sum(t for _, t in self._spent) + tokens > self.tokens_per_minute:
            return None
        entry = [now, float(tokens)]
        self._spent.append(entry)
        self.running += 1
        return entry

    def release(self, entry: list[float], used_tokens: int) -> None:
        """The request is done: it counts ``used_tokens`` (prompt + generated) rather than what it reserved."""
        self.running -= 1
        entry[1] = float(min(entry[1], used_tokens))


@dataclass
class ShadowRun:
    request_id: str
    started: float  # the user's request arrived (time.monotonic): both sides' latencies count from here
    primary_version: str
    shadow: ServedModel
    request: GenerationRequest
    primary: asyncio.Future[PrimaryResult] = field(repr=False)

    def primary_finished(self, result: PrimaryResult) -> None:
        if not self.primary.done():
            self.primary.set_result(result)


@dataclass
class _ShadowAnswer:
    text: str = ""
    tokens: int = 0
    ttft_ms: float | None = None
    e2e_ms: float | None = None
    error: str | None = None


class ShadowMirror:
    def __init__(
        self,
        cfg: ShadowConfig,
        store: ServingStore,
        scorer: ToxicityScorer,
        metrics: ServingMetrics,
        faults: Faults,
        embedder: Embedder | None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.cfg = cfg
        self.store = store
        self.scorer = scorer
        self.metrics = metrics
        self.faults = faults
        self.embedder = embedder if cfg.similarity else None
        self.budget = ShadowBudget(cfg.max_concurrent, cfg.tokens_per_minute, clock)
        self._tasks: set[asyncio.Task[None]] = set()
        self._compare_limiter = anyio.CapacityLimiter(1)  # comparisons queue here, not in the shared thread pool
        self._embedder_failed = False

    def start(
        self, request_id: str, started: float, primary_version: str, request: GenerationRequest, shadow: ServedModel
    ) -> ShadowRun | None:
        """Mirror this request to ``shadow`` if it is sampled and the budget allows; returns the run to hand the
        user's answer to, or None."""
        if not self.cfg.enabled or shadow.ref == primary_version or not split.sampled(request_id, self.cfg.fraction):
            return None
        if shadow.engine.state != "ready":
            self.metrics.shadow.labels(shadow.ref, "skipped_unavailable").inc()
            return None
        reservation = self.budget.acquire(len(request.prompt_token_ids) + request.max_tokens)
        if reservation is None:
            self.metrics.shadow.labels(shadow.ref, "skipped_budget").inc()
            return None
        self.metrics.shadow.labels(shadow.ref, "mirrored").inc()
        mirrored = replace(request, request_id=f"{request_id}-shadow", adapter=shadow.adapter)
        loop = asyncio.get_running_loop()
        run = ShadowRun(request_id, started, primary_version, shadow, mirrored, loop.create_future())
        task = loop.create_task(self._mirror(run, reservation), name=f"shadow-{request_id}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return run

    @property
    def running(self) -> int:
        return len(self._tasks)

    async def drain(self) -> None:
        """Wait for every shadow task (each ends once its user's answer is finished)."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    async def cancel_all(self) -> None:
        """Shutdown: cancel the shadows (their engine requests are aborted), write nothing more."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # --- one mirrored request -------------------------------------------------------------------------------

    async def _mirror(self, run: ShadowRun, reservation: list[float]) -> None:
        try:
            answer = await self._generate(run, reservation)
            primary = await run.primary
            if answer.error is None and primary.status != "ok":
                self.metrics.shadow.labels(run.shadow.ref, "discarded").inc()  # nothing complete to compare with
                return
            entry = await anyio.to_thread.run_sync(self._compare, run, primary, answer, limiter=self._compare_limiter)
            await anyio.to_thread.run_sync(self.store.log_shadow, entry)
        except asyncio.CancelledError:
            raise
        except Exception:  # a shadow never affects the user: log and move on
            log.exception("shadow comparison of request %s failed", run.request_id)

    async def _generate(self, run: ShadowRun, reservation: list[float]) -> _ShadowAnswer:
        engine, req = run.shadow.engine, run.request
        answer = _ShadowAnswer()
        pieces: list[str] = []
        stream = self.faults.apply(run.shadow.ref, engine.generate(req))
        try:
            try:
                async for delta in stream:
                    if answer.ttft_ms is None and delta.new_tokens:
                        answer.ttft_ms = (time.monotonic() - run.started) * 1000
                    answer.tokens += delta.new_tokens
                    pieces.append(delta.text)
            finally:
                await close_stream(stream)
        except asyncio.CancelledError:
            await asyncio.shield(engine.abort(req.request_id))
            raise
        except Exception as exc:
            answer.error = f"{type(exc).__name__}: {exc}"
            self.metrics.shadow.labels(run.shadow.ref, "error").inc()
            log.warning("shadow request %s on %s failed: %s", req.request_id, run.shadow.ref, answer.error)
            try:
                await engine.abort(req.request_id)
            except Exception:
                log.debug("aborting the failed shadow request %s failed too", req.request_id, exc_info=True)
        finally:
            self.budget.release(reservation, len(req.prompt_token_ids) + answer.tokens)
        answer.text = "".join(pieces)
        answer.e2e_ms = (time.monotonic() - run.started) * 1000
        return answer

    def _compare(self, run: ShadowRun, primary: PrimaryResult, answer: _ShadowAnswer) -> ShadowLogEntry:
        """The comparison row (in a worker thread: the scorer and the embedder are CPU work)."""
        ok = answer.error is None
        p_text, s_text = primary.text, answer.text
        p_tox = s_tox = similarity = None
        if ok:
            try:
                p_tox, s_tox = self.scorer.score([p_text, s_text])
            except Exception:
                log.exception("toxicity scoring of shadow request %s failed", run.request_id)
            similarity = self._similarity(p_text, s_text)
        return ShadowLogEntry(
            request_id=run.request_id,
            at=datetime.now(UTC),
            primary_version=run.primary_version,
            shadow_version=run.shadow.ref,
            status="ok" if ok else "error",
            primary_tokens=primary.tokens,
            shadow_tokens=answer.tokens,
            length_ratio=len(s_text) / len(p_text) if ok and p_text else None,
            primary_refusal=is_refusal(p_text),
            shadow_refusal=ok and is_refusal(s_text),
            primary_toxicity=p_tox,
            shadow_toxicity=s_tox,
            similarity=similarity,
            primary_ttft_ms=primary.ttft_ms,
            shadow_ttft_ms=answer.ttft_ms,
            primary_e2e_ms=primary.e2e_ms,
            shadow_e2e_ms=answer.e2e_ms,
            error=answer.error,
        )

    def _similarity(self, a: str, b: str) -> float | None:
        if self.embedder is None or self._embedder_failed or not a.strip() or not b.strip():
            return None
        try:
            vectors = self.embedder.encode([a, b])
        except Exception:  # no similarity rather than no comparison; not retried (a load costs ~15 s)
            self._embedder_failed = True
            log.exception("the shadow embedder failed; similarity stays empty from now on")
            return None
        return cosine(vectors[0], vectors[1])
