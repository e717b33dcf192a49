"""A test hook for the "killed mid-training" tests, put on ``PYTHONPATH`` by ``tests/cli_helpers.py`` together with
``LIFECYCLE_TEST_PAUSE_AFTER_CHECKPOINT=1``; inert without it.

Every rank of the run (``training.worker``) pauses for good right after committing its first checkpoint
(``training.worker._checkpoint``) and says so in ``RUN_DIR/paused.rankN``. The test, which kills the run once rank
0 has paused, then finds the run there on any machine: without the pause a fast CPU could finish the remaining
steps between the checkpoint and the kill, and the test would see a completed run instead of a killed one.

Two details make it hold:
- Ranks run as ``python -m training.worker``: runpy executes the module's code as ``__main__`` (the loader's
  ``get_code``, never ``exec_module``), so patching the module object after it is loaded reaches nothing. The hook
  rewrites the module's source instead: right after ``def _checkpoint`` it rebinds the name to the pausing wrapper,
  which serves the ``-m`` run and a plain import alike.
- The pause is a wait in the main thread, not SIGSTOP: a stopped rank could not run its exit-with-parent thread
  (``core.process.exit_with_parent``), would outlive the killed launcher, and would hold the run's ranks lock
  (``training.runlock``) so that the rerun waited for it forever. A waiting rank dies with its launcher, as a
  rank of a crashed run does.

Python imports ``sitecustomize`` at start-up from the path, so the hook reaches the CLI's launcher's rank processes
without any change to the product.
"""

from __future__ import annotations

import ast
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

TARGET = "training.worker"
FUNCTION = "_checkpoint"
REBIND = f"{FUNCTION} = __import__('sitecustomize').pausing_after({FUNCTION})"


def pausing_after(checkpoint: Callable[..., None]) -> Callable[..., None]:
    """``training.worker._checkpoint(engine, ckpt_dir, step, rank, keep)``, then mark this rank paused and wait."""

    def first_then_pause(engine: Any, ckpt_dir: Path, step: int, rank: int, *args: Any, **kwargs: Any) -> None:
        checkpoint(engine, ckpt_dir, step, rank, *args, **kwargs)
        (Path(ckpt_dir).parent / f"paused.rank{rank}").write_text(f"{os.getpid()} {step}\n")
        threading.Event().wait()

    return first_then_pause


class _PausingLoader(importlib.machinery.SourceFileLoader):
    def get_code(self, fullname: str) -> Any:
        # from the source every time: a bytecode cache holds the code without the rebinding
        return self.source_to_code(self.get_data(self.path), self.path)

    def source_to_code(self, data: Any, path: Any, *, _optimize: int = -1) -> Any:  # type: ignore[override]
        tree = ast.parse(data, filename=str(path))
        at = [i for i, node in enumerate(tree.body) if isinstance(node, ast.FunctionDef) and node.name == FUNCTION]
        if len(at) != 1:
            raise ImportError(f"tests/hooks: {TARGET} has no single top-level def {FUNCTION}; update the hook")
        tree.body[at[0] + 1 : at[0] + 1] = ast.parse(REBIND).body
        return compile(ast.fix_missing_locations(tree), str(path), "exec", dont_inherit=True)


class _PauseAfterFirstCheckpoint(importlib.abc.MetaPathFinder):
    def find_spec(self, name: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if name != TARGET:
            return None
        sys.meta_path.remove(self)  # find the real module, then load it through the rewriting loader
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or not isinstance(spec.loader, importlib.machinery.SourceFileLoader):
            return spec
        assert spec.origin is not None
        return importlib.util.spec_from_file_location(name, spec.origin, loader=_PausingLoader(name, spec.origin))


if os.environ.get("LIFECYCLE_TEST_PAUSE_AFTER_CHECKPOINT"):
    sys.meta_path.insert(0, _PauseAfterFirstCheckpoint())
