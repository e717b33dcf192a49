"""The running gateway as tests see it, and ``started_gateway``, which starts one (the session's is the ``gateway``
fixture of tests/integration/conftest.py; the engine-death tests start their own)."""

from __future__ import annotations

import os
import re
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

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


@contextmanager
def started_gateway(tiny_config: LifecycleConfig, base: Path, factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    """A real ``bentoml serve`` with its own home folder, registry and database, the versions and keys above."""
    from flows.stages import serve_spec
    from serving.config import FaultConfig
    from serving.launcher import GatewayProcess
    from serving.runtime import database_url
    from serving.state.store import ServingStore
    from support.helpers import register_serving_versions

    home = Home(factory.mktemp("gateway-home"))
    versions = register_serving_versions(tiny_config, home, base, factory.mktemp("adapters"))
    bad_id, bad, benign_id = tokens(base)
    slow = versions["slow"].ref
    serving = tiny_config.serving.model_copy(
        update={
            "port": 0,
            "faults": [FaultConfig(version=slow, tpot_delay_ms=SLOW_DELTA_DELAY_MS)],
            "routing": tiny_config.serving.routing.model_copy(update={"fallback": "chat@previous-champion"}),
            "engine": tiny_config.serving.engine.model_copy(update={"max_num_seqs": 2}),
            "safety": tiny_config.serving.safety.model_copy(update={"blocked_output_patterns": [re.escape(bad)]}),
            "brownout": tiny_config.serving.brownout.model_copy(
                # queue depth alone triggers it here: the brownout test's own queued requests wait seconds for a
                # first token on a slow machine, and a TTFT trigger would then brown out the calm request after
                # (the TTFT trigger is unit-tested)
                update={"queue_depth": 3, "max_tokens": BROWNOUT_MAX_TOKENS, "ttft_ms": 3_600_000}
            ),
        }
    )
    cfg = tiny_config.model_copy(update={"serving": serving})
    spec = serve_spec(cfg, home)
    with ServingStore(database_url(spec)) as store:
        # the suite sends well over the default 60 requests a minute on this key; limits are tested on "limited"
        _, key = store.create_key("tests", requests_per_minute=100_000, tokens_per_minute=100_000_000)
        _, other = store.create_key("other-tenant")
        _, limited = store.create_key("limited", requests_per_minute=2, tokens_per_minute=200)
        _, evals = store.create_key("evals", requests_per_minute=100_000, tokens_per_minute=10_000_000)
    with GatewayProcess(spec) as proc:
        yield Gateway(
            proc.url, key, other, limited, evals, "chat", home, cfg, versions, bad_id, bad, benign_id, slow, proc
        )
