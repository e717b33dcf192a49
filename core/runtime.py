"""Process-wide switches set at entry points (the CLI, flows, test session), never at import time.

They keep the project offline and quiet (no hub downloads, no telemetry) and keep every cache and piece of
state under the home folder instead of ``~``. Values already in the environment win, so production can point
any of them elsewhere.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path

from core.home import Home

# Seen on this 2-core machine: a fresh Prefect database took 77 s before the ephemeral API answered.
PREFECT_EPHEMERAL_STARTUP_TIMEOUT_S = 300


def runtime_environment(home: Home) -> dict[str, str]:
    """The variables ``configure`` sets, as a mapping (also used to build child-process environments)."""
    cache = home.cache
    return {
        # offline: models and data come from local folders only
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "HF_HUB_DISABLE_TELEMETRY": "1",
        # telemetry off
        "DO_NOT_TRACK": "1",
        "BENTOML_DO_NOT_TRACK": "true",
        "MLFLOW_DISABLE_TELEMETRY": "true",
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "VLLM_NO_USAGE_STATS": "1",
        # caches and state under the home folder
        "HF_HOME": str(cache / "huggingface"),
        "VLLM_CACHE_ROOT": str(cache / "vllm"),
        "TORCHINDUCTOR_CACHE_DIR": str(cache / "torchinductor"),
        "TORCH_EXTENSIONS_DIR": str(cache / "torch_extensions"),
        "TRITON_CACHE_DIR": str(cache / "triton"),
        "PREFECT_HOME": str(home.prefect),
        "PREFECT_MEMO_STORE_PATH": str(home.prefect / "memo_store.toml"),
        "PREFECT_LOCAL_STORAGE_PATH": str(home.prefect / "storage"),
        "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": str(PREFECT_EPHEMERAL_STARTUP_TIMEOUT_S),
        # a run's own (ephemeral) server skips registering Prefect's block-type catalogue (~7 s of a fresh start
        # here; nothing of ours uses blocks); the long-lived server of `lifecycle schedule`/`ui` registers it
        "PREFECT_API_BLOCKS_REGISTER_ON_START": "false",
        # vLLM on CPU reserves 92% of RAM for its KV cache unless told otherwise (GiB)
        "VLLM_CPU_KVCACHE_SPACE": "2",
        # vLLM logs ~60 INFO lines per engine start to stdout; progress is ours to report (set INFO to debug)
        "VLLM_LOGGING_LEVEL": "WARNING",
        # the tokenizers thread pool and forked workers do not mix
        "TOKENIZERS_PARALLELISM": "false",
        # DeepSpeed probes for an accelerator (and warns) in every process unless told; only without a GPU
        **({} if Path("/dev/nvidiactl").exists() else {"DS_ACCELERATOR": "cpu"}),
    }


def configure(home: Home) -> None:
    """Apply the switches to this process (values already set by the user are kept) and create the folders
    they name: tools such as Prefect's ephemeral server fail on a missing parent folder instead of making it."""
    for key, value in runtime_environment(home).items():
        os.environ.setdefault(key, value)
    os.environ.setdefault("LIFECYCLE_HOME", str(home.root))
    for key in ("PREFECT_HOME", "PREFECT_LOCAL_STORAGE_PATH", "HF_HOME", "VLLM_CACHE_ROOT"):
        Path(os.environ[key]).mkdir(parents=True, exist_ok=True)
    if "VLLM_RPC_BASE_PATH" not in os.environ:
        os.environ["VLLM_RPC_BASE_PATH"] = _ipc_folder()


def _ipc_folder() -> str:
    """A folder of this process's own for vLLM's ZeroMQ sockets (its engine processes inherit it), removed when the
    process exits. vLLM names one ``$TMPDIR/<uuid>`` socket per engine client and leaves it behind when an engine is
    killed: thousands piled up in /tmp here. A short path on purpose: a socket path has a 107-byte limit, which a
    folder in a deep home could pass."""
    folder = tempfile.mkdtemp(prefix="lifecycle-ipc-")
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    return folder
