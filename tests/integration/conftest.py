"""The gateway under test: a real ``bentoml serve`` with real vLLM engines on the tiny model, started once.

Versions (registered without training, see ``helpers.register_serving_versions``): chat/1 champion and chat/2
challenger are LoRA adapters on one base engine; chat/3 (previous-champion, a full model) is the fallback on an
engine of its own. The gateway has its own home folder, so its registry aliases never meet the gate tests'.

chat/4 (``Gateway.slow_model``, no alias, an adapter loaded on first use) answers through ``serving.faults``: a
delay of ``SLOW_DELTA_DELAY_MS`` before every delta after the first, so a request on it has produced tokens and
cannot finish before its client leaves, on any machine (the disconnect tests).

The post-filter is configured with a known-bad string (``BAD``): a token of the tiny vocabulary repeated, which
the model emits when a request's ``logit_bias`` pushes that token and never otherwise. The brownout threshold
is reachable with a handful of requests (two sequences at a time, queue depth 3).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from gateway_helpers import BROWNOUT_MAX_TOKENS, SLOW_DELTA_DELAY_MS, Gateway, tokens

from core.home import Home
from flows.config import LifecycleConfig
from serving.config import FaultConfig


@pytest.fixture(scope="session")
def gateway(
    tiny_config: LifecycleConfig, tiny_base_model: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Gateway]:
    from helpers import register_serving_versions

    from flows.stages import serve_spec
    from serving.launcher import GatewayProcess
    from serving.runtime import database_url
    from serving.state.store import ServingStore

    home = Home(tmp_path_factory.mktemp("gateway-home"))
    base = Path(tiny_base_model.path)
    versions = register_serving_versions(tiny_config, home, base, tmp_path_factory.mktemp("adapters"))
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
