"""The GPU tests' promise, checked on every CPU run: their fixtures and the training path need torch, DeepSpeed,
transformers and this package only. A child interpreter in which MLflow, Prefect, vLLM and BentoML cannot be
imported builds the tiny inputs (``training.workbench``: chat and pair snapshots, the bootstrapped base model) and
imports the GPU tests, the fine-tune launcher and the rank's worker."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from core.home import Home

REPO = Path(__file__).resolve().parents[2]
FORBIDDEN = ("mlflow", "prefect", "vllm", "bentoml")

CHILD = textwrap.dedent(
    """
    import sys

    for name in {forbidden!r}:  # as if not installed: import fails, importlib.util.find_spec says None
        sys.modules[name] = None
    sys.path[:0] = [{tests!r}, {gpu!r}, {repo!r}]
    import importlib.util
    for name, path in (("root_conftest", {root_conftest!r}), ("gpu_conftest", {gpu_conftest!r})):
        spec = importlib.util.spec_from_file_location(name, path)  # both are conftest.py: pytest loads both
        spec.loader.exec_module(importlib.util.module_from_spec(spec))
    import test_gpu
    import training.finetune.launch, training.finetune.worker
    from training.workbench import Workbench
    from pathlib import Path
    bench = Workbench.from_yaml(Path({tiny!r}), Path({root!r}), ["bootstrap.pretrain.steps=2"])
    chat = bench.chat_snapshot()
    pairs = bench.pair_snapshot()
    base = bench.base_model(chat)
    print(chat.hash[:12], pairs.hash[:12], base.path.name)
    """
)


def test_the_gpu_suite_runs_without_mlflow_prefect_vllm_or_bentoml(tmp_path: Path) -> None:
    code = CHILD.format(
        forbidden=FORBIDDEN,
        tests=str(REPO / "tests"),
        gpu=str(REPO / "tests" / "gpu"),
        repo=str(REPO),
        tiny=str(REPO / "configs" / "tiny.yaml"),
        root_conftest=str(REPO / "tests" / "conftest.py"),
        gpu_conftest=str(REPO / "tests" / "gpu" / "conftest.py"),
        root=str(tmp_path / "home"),
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    chat, pairs, base = proc.stdout.strip().splitlines()[-1].split()
    assert len(chat) == len(pairs) == 12 and base
    assert (Home(tmp_path / "home").base_models / base / "config.json").is_file()
