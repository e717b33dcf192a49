"""Fixtures of the GPU tests: the tiny config's inputs made by ``training.workbench``, nothing else.

These tests run on a bare CUDA machine (torch, DeepSpeed, transformers and this package): no fixture here, nor
anything it imports, reaches MLflow, Prefect, vLLM or BentoML (``test_bare_imports.py`` checks it on every run).

    make test-gpu                 # or: python -m pytest -m gpu tests/gpu
"""

from __future__ import annotations

from pathlib import Path

import pytest

from training.data.snapshot import Snapshot
from training.model.modelio import ModelFolder
from training.workbench import Workbench

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def bench(tmp_path_factory: pytest.TempPathFactory) -> Workbench:
    # pretrained a little longer than tiny.yaml, as the CPU suite's base model is, so the loss has room to fall
    return Workbench.from_yaml(
        REPO / "configs" / "tiny.yaml", tmp_path_factory.mktemp("gpu-home"), ["bootstrap.pretrain.steps=150"]
    )


@pytest.fixture(scope="session")
def chat_snapshot(bench: Workbench) -> Snapshot:
    return bench.chat_snapshot()


@pytest.fixture(scope="session")
def base_model(bench: Workbench, chat_snapshot: Snapshot) -> ModelFolder:
    return bench.base_model(chat_snapshot)


@pytest.fixture(scope="session")
def pair_snapshot(bench: Workbench) -> Snapshot:
    return bench.pair_snapshot()
