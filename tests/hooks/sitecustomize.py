"""A test hook for the "killed mid-training" tests, put on ``PYTHONPATH`` by ``tests/cli_helpers.py`` and
tests/integration/test_train.py together with ``LIFECYCLE_TEST_PAUSE_AFTER_CHECKPOINT=1``; inert without it.

Every process of the run that commits a fine-tune checkpoint (``training.worker._checkpoint``: each DeepSpeed rank)
stops itself with SIGSTOP right after its first one. The test, which kills the run's process group as soon as it
sees that checkpoint, then finds the run there on any machine: without the pause a fast CPU could finish the
remaining steps between the checkpoint and the kill, and the test would see a completed run instead of a killed
one. Python imports ``sitecustomize`` at start-up from the path, so the hook reaches the CLI and its launcher's
rank processes without any change to the product.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import signal
import sys
from types import ModuleType
from typing import Any

TARGET = "training.worker"


class _PauseAfterFirstCheckpoint(importlib.abc.MetaPathFinder):
    def find_spec(self, name: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if name != TARGET:
            return None
        sys.meta_path.remove(self)  # find the real module once, then wrap its loader
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        run = loader.exec_module

        def exec_module(module: ModuleType) -> None:
            run(module)
            checkpoint = module._checkpoint

            def first_then_stop(*args: Any, **kwargs: Any) -> None:
                checkpoint(*args, **kwargs)
                os.kill(os.getpid(), signal.SIGSTOP)

            module._checkpoint = first_then_stop

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


if os.environ.get("LIFECYCLE_TEST_PAUSE_AFTER_CHECKPOINT"):
    sys.meta_path.insert(0, _PauseAfterFirstCheckpoint())
