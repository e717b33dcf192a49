"""Fault injection for rollout drills and tests (``serving.faults`` in the config), like Envoy's fault filter:
latency added to every answer of a named version, on whatever path it answers (primary, canary or shadow).

    faults = Faults(cfg.faults)
    async for delta in faults.apply("chat/5", engine.generate(request)): ...

``ttft_delay_ms`` is slept before the engine request starts (so it lands in the measured time to first token and
holds no engine slot meanwhile), ``tpot_delay_ms`` before every delta after the first (time per output token).
``sleep`` is an attribute so a test can record the delays instead of waiting for them.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence

from serving.config import FaultConfig
from serving.engines.engine import Delta, close_stream

Sleep = Callable[[float], Awaitable[None]]


class Faults:
    def __init__(self, faults: Sequence[FaultConfig], sleep: Sleep = asyncio.sleep) -> None:
        self._by_version = {f.version: f for f in faults if f.ttft_delay_ms or f.tpot_delay_ms}
        self.sleep = sleep

    def for_version(self, ref: str) -> FaultConfig | None:
        return self._by_version.get(ref)

    def apply(self, ref: str, deltas: AsyncIterator[Delta]) -> AsyncIterator[Delta]:
        """``deltas`` delayed as configured for version ``ref`` (``deltas`` itself when no fault names it)."""
        fault = self._by_version.get(ref)
        return deltas if fault is None else self._delayed(fault, deltas)

    async def _delayed(self, fault: FaultConfig, deltas: AsyncIterator[Delta]) -> AsyncIterator[Delta]:
        try:
            if fault.ttft_delay_ms:
                await self.sleep(fault.ttft_delay_ms / 1000)
            first = True
            async for delta in deltas:
                if not first and fault.tpot_delay_ms:
                    await self.sleep(fault.tpot_delay_ms / 1000)
                first = False
                yield delta
        finally:
            await close_stream(deltas)  # the engine's own bookkeeping (in-flight counts) ends now, not at GC
