"""The gateway under test: a real ``bentoml serve`` with real vLLM engines on the tiny model, started once per
session (``support.gateway_helpers.started_gateway``; the engine-death tests start one of their own).

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

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.gateway_helpers import Gateway, started_gateway

from flows.config import LifecycleConfig


@pytest.fixture(scope="session")
def gateway(
    tiny_config: LifecycleConfig, tiny_base_model: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Gateway]:
    with started_gateway(tiny_config, Path(tiny_base_model.path), tmp_path_factory) as gw:
        yield gw
