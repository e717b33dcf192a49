from __future__ import annotations

import os
from pathlib import Path

import pytest

from core import runtime
from core.home import Home


def test_home_resolution_order(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("LIFECYCLE_HOME", raising=False)
    monkeypatch.chdir(tmp_path)
    assert Home.resolve().root == tmp_path / ".lifecycle"
    monkeypatch.setenv("LIFECYCLE_HOME", str(tmp_path / "env"))
    assert Home.resolve().root == tmp_path / "env"
    assert Home.resolve(tmp_path / "flag").root == tmp_path / "flag"


def test_every_path_lives_under_the_home_folder(tmp_path: Path) -> None:
    home = Home(tmp_path)
    env = runtime.runtime_environment(home)
    cache_keys = [
        "HF_HOME",
        "VLLM_CACHE_ROOT",
        "TORCHINDUCTOR_CACHE_DIR",
        "TORCH_EXTENSIONS_DIR",
        "PREFECT_HOME",
        "PREFECT_MEMO_STORE_PATH",
        "PREFECT_LOCAL_STORAGE_PATH",
    ]
    for key in cache_keys:
        assert Path(env[key]).is_relative_to(tmp_path), key
    assert env["HF_HUB_OFFLINE"] == "1" and env["MLFLOW_DISABLE_TELEMETRY"] == "true"
    assert env["PREFECT_SERVER_ANALYTICS_ENABLED"] == "false" and env["BENTOML_DO_NOT_TRACK"] == "true"
    assert int(env["PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"]) >= 120
    assert "VLLM_CPU_KVCACHE_SPACE" in env


def test_configure_keeps_values_the_user_set(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("VLLM_CACHE_ROOT", "/somewhere/else")
    for key in runtime.runtime_environment(Home(tmp_path)):
        if key != "VLLM_CACHE_ROOT":
            monkeypatch.delenv(key, raising=False)
    runtime.configure(Home(tmp_path))
    assert os.environ["VLLM_CACHE_ROOT"] == "/somewhere/else"
    assert os.environ["HF_HOME"] == str(tmp_path / "cache" / "huggingface")


def test_importing_the_packages_has_no_side_effects(tmp_path: Path) -> None:
    """No directories created and no env changed at import time (CONVENTIONS: no import-time side effects)."""
    import subprocess
    import sys

    code = (
        "import os, json; before = dict(os.environ); "
        "import core, core.config, core.home, core.runtime, flows.config, flows.cli, training.data.snapshot, "
        "training.data.synth, training.data.records; "
        "print(json.dumps(sorted(set(os.environ.items()) ^ set(before.items()))))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
    assert list(tmp_path.iterdir()) == []


def test_vllm_sockets_go_to_a_folder_of_the_process_removed_at_exit(tmp_path: Path) -> None:
    """vLLM leaves a ZeroMQ socket file in $TMPDIR per engine client it starts; ours go to a folder of the process."""
    import subprocess
    import sys

    code = (
        "import os, sys; from pathlib import Path; from core import runtime; from core.home import Home; "
        "os.environ.pop('VLLM_RPC_BASE_PATH', None); runtime.configure(Home(Path(sys.argv[1]))); "
        "folder = os.environ['VLLM_RPC_BASE_PATH']; print(folder, os.path.isdir(folder))"
    )
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, check=True)
    folder, existed = out.stdout.split()
    assert existed == "True" and len(folder) < 60  # short: a socket path holds at most 107 bytes
    assert not Path(folder).exists()
