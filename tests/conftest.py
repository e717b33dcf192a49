"""Session fixtures: an isolated home folder, the tiny config, and a tiny snapshot + base model built once.

The runtime switches (offline, telemetry off, caches under the home folder) are applied here because the test
session is an entry point, like the CLI.

Both CPU classes on one machine: ``pytest --engine-dtype float32`` (or ``LIFECYCLE_TEST_ENGINE_DTYPE=float32``)
forces ``serving.engine.dtype`` and ``evals.engine.dtype`` in every config the fixtures load (``helpers.
engine_overrides``); ``bfloat16`` likewise. Without it the configs decide (serving's ``auto`` picks bf16 on CPUs
with bf16 units, fp32 elsewhere).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from core import runtime
from core.home import Home
from flows.config import CONFIG_DIR, LifecycleConfig, load_config

REPO = Path(__file__).resolve().parent.parent


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--engine-dtype",
        choices=("bfloat16", "float32"),
        default=None,
        help="force serving.engine.dtype and evals.engine.dtype in the configs the fixtures load "
        "(default: $LIFECYCLE_TEST_ENGINE_DTYPE, else what the configs say)",
    )


def pytest_configure(config: pytest.Config) -> None:
    from support.helpers import ENGINE_DTYPE_ENV

    dtype = config.getoption("--engine-dtype")
    if dtype:  # the environment carries it to helpers.engine_overrides, also in modules without fixtures
        os.environ[ENGINE_DTYPE_ENV] = dtype


@pytest.fixture(scope="session")
def session_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Home]:
    home = Home(tmp_path_factory.mktemp("lifecycle-home"))
    old = os.environ.get("LIFECYCLE_HOME")
    # DeepSpeed JIT-builds a CPU communication op once per extensions cache (~90 s): the test session keeps one
    # cache for all its temporary homes, including the CLI subprocesses of the e2e tests.
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(REPO / ".lifecycle" / "cache" / "torch_extensions"))
    runtime.configure(home)
    os.environ["LIFECYCLE_HOME"] = str(home.root)
    yield home
    if old is None:
        os.environ.pop("LIFECYCLE_HOME", None)
    else:
        os.environ["LIFECYCLE_HOME"] = old


@pytest.fixture(scope="session")
def tiny_config() -> LifecycleConfig:
    from support.helpers import engine_overrides

    return load_config(CONFIG_DIR / "tiny.yaml", engine_overrides())


@pytest.fixture(scope="session")
def tiny_snapshot(tiny_config: LifecycleConfig, session_home: Home):  # type: ignore[no-untyped-def]
    from flows.stages import snapshot_stage

    return snapshot_stage(tiny_config, session_home)


@pytest.fixture(scope="session")
def tiny_base_model(tiny_config: LifecycleConfig, session_home: Home, tiny_snapshot):  # type: ignore[no-untyped-def]
    """The tiny bootstrap, trained a little longer than tiny.yaml so greedy outputs are not all one token."""
    from flows.config import load_config
    from flows.stages import base_model_stage

    cfg = load_config(CONFIG_DIR / "tiny.yaml", ["bootstrap.pretrain.steps=150"])
    return base_model_stage(cfg, session_home, tiny_snapshot, progress=False)


@pytest.fixture(scope="session")
def prefect_harness(session_home: Home) -> Iterator[None]:
    """A temporary Prefect server and database for in-process flow runs, stopped at the end of the session
    (left to Prefect's atexit hook, it logs into streams pytest has already closed)."""
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=None):  # None: our 300 s ephemeral start-up timeout
        yield
