"""Brownout: shedding load before the primary engine falls over.

``decide`` is pure: given an engine's queue depth and its recent TTFT (p90 over ``window_s``), it says whether
the request runs in brownout and what that means (cap ``max_tokens``, send it to the fallback). The gateway
applies the decision, marks the response (``x-brownout`` header) and counts it.
"""

from __future__ import annotations

import math
import time
from collections import deque
from dataclasses import dataclass

from serving.config import BrownoutConfig


@dataclass(frozen=True)
class BrownoutDecision:
    active: bool
    reasons: tuple[str, ...] = ()
    max_tokens: int | None = None
    use_fallback: bool = False

    def header(self) -> str:
        actions = [f"max_tokens={self.max_tokens}"] + (["fallback"] if self.use_fallback else [])
        return "; ".join(actions + [f"reason={','.join(self.reasons)}"])


def decide(queue_depth: int, ttft_p90_ms: float | None, cfg: BrownoutConfig, fallback_ready: bool) -> BrownoutDecision:
    if not cfg.enabled:
        return BrownoutDecision(False)
    reasons = []
    if queue_depth >= cfg.queue_depth:
        reasons.append(f"queue_depth={queue_depth}")
    if ttft_p90_ms is not None and ttft_p90_ms >= cfg.ttft_ms:
        reasons.append(f"ttft_p90_ms={ttft_p90_ms:.0f}")
    if not reasons:
        return BrownoutDecision(False)
    return BrownoutDecision(True, tuple(reasons), cfg.max_tokens, cfg.use_fallback and fallback_ready)


class TtftWindow:
    """Recent time-to-first-token samples of one engine, for the p90 that ``decide`` reads."""

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self._samples: deque[tuple[float, float]] = deque(maxlen=2048)

    def add(self, ttft_ms: float, now: float | None = None) -> None:
        self._samples.append((now if now is not None else time.monotonic(), ttft_ms))

    def p90(self, now: float | None = None) -> float | None:
        now = now if now is not None else time.monotonic()
        while self._samples and now - self._samples[0][0] > self.window_s:
            self._samples.popleft()
        if not self._samples:
            return None
        values = sorted(v for _, v in self._samples)
        return values[math.ceil(0.9 * len(values)) - 1]  # nearest rank: one slow request in ten is not the p90
