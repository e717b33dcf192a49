"""The registry against a real ``mlflow server`` (HTTP, artifacts proxied), as production points it at one."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from core.home import Home
from core.process import free_port
from registry.config import RegistryConfig
from registry.lineage import register_base_model
from registry.store import MlflowRegistry


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    root = tmp_path_factory.mktemp("mlflow-server")
    port = free_port()
    exe = str(Path(sys.executable).parent / "mlflow")
    log = (root / "server.log").open("w")
    proc = subprocess.Popen(
        [
            exe,
            "server",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--workers",
            "1",
            "--backend-store-uri",
            f"sqlite:///{root / 'mlflow.db'}",
            "--artifacts-destination",
            str(root / "artifacts"),
        ],
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=log,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 240  # 20-74 s seen on this machine
        while True:
            assert proc.poll() is None, (root / "server.log").read_text()[-2000:]
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            assert time.monotonic() < deadline, "mlflow server did not become healthy"
            time.sleep(0.5)
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
        log.close()


def test_register_alias_and_load_back_through_the_server(mlflow_server: str, tiny_base_model, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    reg = MlflowRegistry(RegistryConfig(tracking_uri=mlflow_server), Home(tmp_path / "home"))
    assert reg.tracking_uri == mlflow_server
    version = register_base_model(
        reg,
        folder=tiny_base_model.path,
        manifest=tiny_base_model.manifest,
        curve=[{"step": 1, "loss": 2.0}],
        git_sha="abc",
        flow_run_id="run-1",
    )
    assert version.name == "chat-base" and version.lineage["weights_hash"] == tiny_base_model.manifest["weights_hash"]
    assert version.source.startswith("mlflow-artifacts:")  # stored by the server, not on this filesystem
    again = register_base_model(
        reg,
        folder=tiny_base_model.path,
        manifest=tiny_base_model.manifest,
        curve=[],
        git_sha="abc",
        flow_run_id="run-2",
    )
    assert again.version == version.version  # idempotent on the weights hash

    reg.set_alias("chat-base", "champion", version.version, reason="test promotion", actor="pytest")
    assert reg.by_alias("chat-base", "champion").tags["alias.champion.reason"] == "test promotion"
    folder = reg.resolve("chat-base@champion")
    for name in ("model.safetensors", "config.json", "tokenizer.json", "chat_template.jinja"):
        assert (folder / name).read_bytes() == (tiny_base_model.path / name).read_bytes()
    history = reg.client.get_metric_history(version.run_id, "loss")
    assert [(m.step, m.value) for m in history] == [(1, 2.0)]
