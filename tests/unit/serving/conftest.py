"""Fixtures of the serving unit tests: the anyio backend and ``make_harness``, a gateway on fakes (see harness.py)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from unit.serving.harness import Harness, MakeHarness, build_harness

from core.home import Home
from core.runtime import runtime_environment


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def make_harness(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[MakeHarness]:
    """``make_harness(serving={...overrides}, factory=FakeFactory(...), load=True)``: a gateway on fakes, its
    home and SQLite store under tmp_path (call it once per test: the keys it creates have fixed names)."""
    # GatewayRuntime applies the process-wide runtime switches (os.environ.setdefault): pin them through
    # monkeypatch so they are undone after the test instead of pointing later tests at this tmp_path
    home = Home(tmp_path / "home")
    for name, value in {**runtime_environment(home), "LIFECYCLE_HOME": str(home.root)}.items():
        monkeypatch.setenv(name, os.environ.get(name, value))
    built: list[Harness] = []

    def make(serving: dict[str, Any] | None = None, **kwargs: Any) -> Harness:
        harness = build_harness(home.root, tmp_path / "registry", serving, **kwargs)
        built.append(harness)
        return harness

    yield make
    for harness in built:
        harness.runtime.shutdown()
