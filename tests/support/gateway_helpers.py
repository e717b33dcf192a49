"""The running gateway as tests see it (the fixture is in tests/integration/conftest.py)."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from core.home import Home
from flows.config import LifecycleConfig

BROWNOUT_MAX_TOKENS = 12
SLOW_DELTA_DELAY_MS = 600_000  # chat/4's delay before each delta after the first: it never finishes in a test


@dataclass
class Gateway:
    url: str
    api_key: str
    other_key: str
    limited_key: str
    eval_key: str
    model: str
    home: Home
    config: LifecycleConfig
    versions: dict[str, Any]
    bad_token_id: int
    bad_string: str
    benign_token_id: int
    slow_model: str  # chat/4: every delta after the first arrives SLOW_DELTA_DELAY_MS late (serving.faults)
    process: Any = field(repr=False)

    @property
    def base_url(self) -> str:
        return self.url + "/v1"

    def client(self, key: str | None = None, **kwargs: Any) -> Any:
        import openai

        return openai.OpenAI(base_url=self.base_url, api_key=key or self.api_key, max_retries=0, **kwargs)

    def bad_bias(self) -> dict[str, int]:
        """A logit_bias that makes the model emit the known-bad string."""
        return {str(self.bad_token_id): 100}

    def engines(self) -> dict[str, Any]:
        """/readyz's engines: key -> state, queue_depth, in_flight, pids."""
        return httpx.get(self.url + "/readyz", timeout=10).json()["engines"]  # type: ignore[no-any-return]

    def primary_engine(self) -> str:
        """The key of the base engine that chat/1, chat/2 and chat/4 (adapters) run on."""
        return next(k for k in self.engines() if k.startswith("lora:") and "#" not in k)

    def wait_engine(self, key: str, *, in_flight: int, queue_depth: int, timeout_s: float = 60) -> None:
        """Until engine ``key`` has exactly this many requests in flight and waiting for their first token."""
        deadline = time.monotonic() + timeout_s
        state: dict[str, Any] = {}
        while time.monotonic() < deadline:
            state = self.engines()[key]
            if state["in_flight"] == in_flight and state["queue_depth"] == queue_depth:
                return
            time.sleep(0.05)
        raise AssertionError(f"engine {key} never had {in_flight} in flight, {queue_depth} waiting: {state}")

    @contextmanager
    def paused(self, key: str) -> Iterator[None]:
        """The engine's core processes stopped (SIGSTOP) and continued on exit: its requests wait, for as long as
        a test needs, whatever the machine's speed (a stalled engine, as a noisy neighbour or a swap storm makes)."""
        pids = self.engines()[key]["pids"]
        assert pids, f"engine {key} shows no process ids"
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
        try:
            yield
        finally:
            for pid in pids:
                os.kill(pid, signal.SIGCONT)


def tokens(base: Path) -> tuple[int, str, int]:
    """A purely alphabetic token of 4+ characters (repeated three times: a string no reply contains, the known-bad
    string) and another such token (pushed by logit_bias it keeps a generation going to max_tokens)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(base))
    candidates = []
    for token_id in range(tok.vocab_size):
        text = tok.decode([token_id])
        if text.isalpha() and len(text) >= 4:
            candidates.append((token_id, text))
    assert candidates, "the tiny tokenizer has no 4-letter token"
    token_id, text = candidates[len(candidates) // 2]
    return token_id, text * 3, candidates[0][0]
