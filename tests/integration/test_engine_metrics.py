"""Engines started side by side in one process register vLLM's Prometheus families without colliding."""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator

import pytest


@pytest.fixture
def eager_thread_switches() -> Iterator[None]:
    """Switch threads every microsecond, so constructions that are not serialized interleave here as they do in a
    busy gateway (the CI run that found this failed 35 tests at the gateway's start)."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(before)


def test_stat_loggers_built_side_by_side_do_not_collide(tiny_base_model, eager_thread_switches) -> None:  # type: ignore[no-untyped-def]
    """vLLM's Prometheus logger unregisters every ``vllm:*`` collector, then registers its own: two engines that
    build it at once (the router starts a base and a LoRA engine together) can interleave the two steps. The
    logger the engine hands to vLLM builds under a lock; vLLM's own fails here (checked: 14 of 20)."""
    from vllm.engine.arg_utils import AsyncEngineArgs

    from serving.engines.engine import _serialized_prometheus_logger

    config = AsyncEngineArgs(model=str(tiny_base_model.path), dtype="float32", max_model_len=256).create_engine_config()
    logger_cls = _serialized_prometheus_logger()
    errors: list[BaseException] = []
    for _ in range(5):
        barrier = threading.Barrier(4)

        def build(barrier: threading.Barrier = barrier) -> None:
            barrier.wait()
            try:
                logger_cls(config, [0])
            except Exception as exc:  # noqa: BLE001 - collected and asserted on below
                errors.append(exc)

        threads = [threading.Thread(target=build) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert errors == []
