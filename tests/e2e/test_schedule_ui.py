"""``lifecycle ui`` and ``lifecycle schedule`` as a user runs them: real servers on free ports, stopped by Ctrl-C.

The schedule test shortens the rollout controller's interval to a few seconds and waits for Prefect's scheduler
to run it on its own (on an empty registry the controller has nothing to do, and says so).
"""

from __future__ import annotations

import queue
import re
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from support.cli_helpers import EXE, ctrl_c_reaches_it, user_env

from core.home import Home
from flows.config import CONFIG_DIR

TINY = str(CONFIG_DIR / "tiny.yaml")
FREE_PORTS = ["--set", "schedule.mlflow_port=0", "--set", "schedule.prefect_port=0"]
SHUTDOWN_GUARD_S = 180
# what Prefect's own client allows a request (PREFECT_API_REQUEST_TIMEOUT): its SQLite server may wait up to 10 s
# for the database lock alone (PREFECT_SERVER_DATABASE_TIMEOUT) while flow runs start beside it; a 10 s limit here
# failed once in CI (a ReadTimeout while the scheduler started the first runs)
API_TIMEOUT_S = 60


class Running:
    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.proc = proc
        self.lines: queue.Queue[str] = queue.Queue()
        self.seen: list[str] = []
        assert proc.stderr is not None
        stream = proc.stderr
        threading.Thread(target=lambda: [self.lines.put(line) for line in stream], daemon=True).start()

    def wait_for(self, pattern: str, timeout_s: float = 400) -> re.Match[str]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for line in self.seen:
                if m := re.search(pattern, line):
                    return m
            try:
                self.seen.append(self.lines.get(timeout=1))
            except queue.Empty:
                assert self.proc.poll() is None, "".join(self.seen)[-3000:]
        raise AssertionError(f"no line matching {pattern!r}: {''.join(self.seen)[-3000:]}")

    def interrupt(self) -> int:
        """Ctrl-C, then its exit status. In-flight flow runs finish first (Prefect's runner waits for them and
        gives a run it must stop 30 s of grace), so the hang guard is generous; on a hang, what it printed."""
        self.proc.send_signal(signal.SIGINT)
        try:
            return self.proc.wait(timeout=SHUTDOWN_GUARD_S)
        except subprocess.TimeoutExpired:
            while not self.lines.empty():
                self.seen.append(self.lines.get())
            said = "".join(self.seen)[-4000:]
            raise AssertionError(f"still running {SHUTDOWN_GUARD_S} s after Ctrl-C: {said}") from None


@contextmanager
def started(*args: str, home: Path) -> Iterator[Running]:
    proc = subprocess.Popen(
        [EXE, *args, "--config", TINY, "--home", str(home), *FREE_PORTS],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        # Prefect's scheduler looks for runs to create every 60 s by default: 5 s here, so the test waits less
        env={**user_env(home), "PREFECT_SERVER_SERVICES_SCHEDULER_LOOP_SECONDS": "5"},
        preexec_fn=ctrl_c_reaches_it,
    )
    try:
        yield Running(proc)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=SHUTDOWN_GUARD_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                raise


def _gone(url: str) -> bool:
    try:
        httpx.get(url, timeout=3)
    except httpx.TransportError:
        return True
    return False


@pytest.fixture
def home(tmp_path: Path, session_home: Home) -> Path:
    return tmp_path / "home"


def test_ui_serves_the_mlflow_registry_and_prefect_until_ctrl_c(home: Path) -> None:
    with started("ui", home=home) as ui:
        mlflow = ui.wait_for(r"MLflow UI: (http://\S+)")[1]
        prefect = ui.wait_for(r"Prefect UI: (http://\S+)")[1]
        ui.wait_for("Ctrl-C stops them")
        assert httpx.get(mlflow + "/health", timeout=API_TIMEOUT_S).status_code == 200
        # the registry a reviewer promotes from: the home's own store
        models = httpx.get(mlflow + "/api/2.0/mlflow/registered-models/search", timeout=API_TIMEOUT_S)
        assert models.status_code == 200
        assert httpx.get(prefect + "/api/health", timeout=API_TIMEOUT_S).status_code == 200
        assert ui.interrupt() == 0
        ui.wait_for("UIs stopped")
    assert (home / "mlflow" / "mlflow.db").is_file()
    time.sleep(1)
    assert _gone(mlflow + "/health") and _gone(prefect + "/api/health")


def test_schedule_serves_the_deployments_and_prefect_runs_them(home: Path) -> None:
    args = ("schedule", "--set", "schedule.rollout_controller_every_s=5")
    with started(*args, home=home) as sched:
        prefect = sched.wait_for(r"Prefect UI: (http://\S+?)  ")[1]
        sched.wait_for("Ctrl-C stops the schedules")
        api = prefect + "/api"
        expected = {
            "rollout-controller",
            "safety-classifier-canary",
            "monitor",
            "champion-eval",
            "retrain-check",
            "log-retention",
        }
        deadline = time.monotonic() + 120
        names: set[str] = set()
        # the deployments register one by one: wait for all of them (polling until 5 raced the sixth)
        while time.monotonic() < deadline and not expected <= names:
            deps: list[dict[str, Any]] = httpx.post(api + "/deployments/filter", json={}, timeout=API_TIMEOUT_S).json()
            names = {d["name"] for d in deps}
            time.sleep(1)
        assert names == expected
        by_name = {d["name"]: d for d in deps}
        assert by_name["champion-eval"]["schedules"][0]["schedule"]["cron"] == "0 3 * * *"
        assert by_name["log-retention"]["schedules"][0]["schedule"]["cron"] == "30 1 * * *"
        assert by_name["rollout-controller"]["schedules"][0]["schedule"]["interval"] == 5.0
        # Prefect's scheduler runs the controller on its own, in a subprocess of `lifecycle schedule`
        controller = by_name["rollout-controller"]["id"]
        completed = {"state": {"type": {"any_": ["COMPLETED"]}}}
        body = {"deployments": {"id": {"any_": [controller]}}, "flow_runs": completed}
        deadline = time.monotonic() + 300
        runs: list[dict[str, Any]] = []
        while time.monotonic() < deadline and not runs:
            runs = httpx.post(api + "/flow_runs/filter", json=body, timeout=API_TIMEOUT_S).json()
            time.sleep(2)
        assert runs, "the scheduled rollout controller never completed a run"
        assert sched.interrupt() == 0
    time.sleep(1)
    assert _gone(api + "/health")
