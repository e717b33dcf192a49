"""The native production stack of ``scripts/stack.sh`` for the e2e tests, and small clients of its Prefect and
MLflow servers' REST APIs.

    with NativeStack.start(tmp, workers=2, base_config=cfg) as stack:   # stack.sh up on free ports; down after
        stack.prefect.deployment("rollout-controller")
        stack.kill("worker-1")                                          # SIGKILL to the worker's process group

Every server binds 127.0.0.1 on a free port; ``stack.sh down`` stops them all (also when the test failed), and the
folder is deleted. Needs Debian's postgresql and redis-server: installed with ``scripts/install-services.sh``
when missing; ``Unavailable`` says why that was impossible (the tests skip with it).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import httpx

from core.process import free_port

REPO = Path(__file__).resolve().parents[2]
STACK = REPO / "scripts" / "stack.sh"
INSTALL = REPO / "scripts" / "install-services.sh"
T = TypeVar("T")


class Unavailable(Exception):
    """The stack cannot run here (Debian's services missing and not installable)."""


def require_services() -> None:
    have = (
        shutil.which("redis-server")
        and shutil.which("haproxy")
        and shutil.which("prometheus")
        and shutil.which("prometheus-alertmanager")
        and list(Path("/usr/lib/postgresql").glob("*/bin/initdb"))
    )
    if have:
        return
    proc = subprocess.run(["bash", str(INSTALL)], capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        why = (proc.stderr.strip().splitlines() or [f"exit code {proc.returncode}"])[-1]
        raise Unavailable(f"PostgreSQL/Redis/HAProxy/Prometheus are not installed and {INSTALL.name} failed: {why}")


def wait_for(what: str, probe: Callable[[], T | None], timeout_s: float, every_s: float = 1.0) -> T:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = probe()
        if got:
            return got
        time.sleep(every_s)
    raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")


class PrefectApi:
    """The few REST calls the tests make on the stack's Prefect server."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.http = httpx.Client(base_url=url, timeout=30)

    def deployment(self, name: str) -> dict[str, Any]:
        (dep,) = [d for d in self.http.post("/deployments/filter", json={}).json() if d["name"] == name]
        return dep

    def set_paused(self, name: str, paused: bool) -> None:
        action = "pause_deployment" if paused else "resume_deployment"
        self.http.post(f"/deployments/{self.deployment(name)['id']}/{action}").raise_for_status()

    def runs(self, deployment: str, *, since: str | None = None) -> list[dict[str, Any]]:
        body: dict[str, Any] = {
            "deployments": {"id": {"any_": [self.deployment(deployment)["id"]]}},
            "sort": "EXPECTED_START_TIME_ASC",
            "limit": 200,
        }
        if since is not None:
            body["flow_runs"] = {"expected_start_time": {"after_": since}}
        return list(self.http.post("/flow_runs/filter", json=body).json())

    def run(self, run_id: str) -> dict[str, Any]:
        return dict(self.http.get(f"/flow_runs/{run_id}").json())

    def states(self, run_id: str) -> list[dict[str, Any]]:
        states = self.http.get("/flow_run_states/", params={"flow_run_id": run_id}).json()
        return sorted(states, key=lambda s: s["timestamp"])

    def logs(self, run_id: str) -> list[tuple[str, str]]:
        """(timestamp, message) of the run's logs, workers' lines about it included."""
        body = {"logs": {"flow_run_id": {"any_": [run_id]}}, "sort": "TIMESTAMP_ASC", "limit": 200}
        return [(row["timestamp"], row["message"]) for row in self.http.post("/logs/filter", json=body).json()]

    def events(self, run_id: str, name: str) -> list[dict[str, Any]]:
        """The server's events ``name`` about flow run ``run_id`` (heartbeats, state changes)."""
        body = {
            "filter": {"event": {"name": [name]}, "resource": {"id": [f"prefect.flow-run.{run_id}"]}},
            "limit": 50,
        }
        return list(self.http.post("/events/filter", json=body).json()["events"])

    def hold_lock(self, name: str, lease_s: int) -> str:
        """Take the one slot of lock ``name`` (as a running tick would); returns the lease."""
        body = {"names": [name], "slots": 1, "lease_duration": lease_s}
        got = self.http.post("/v2/concurrency_limits/increment-with-lease", json=body).json()
        assert got["limits"], f"lock {name} does not exist"
        return str(got["lease_id"])

    def release(self, lease: str) -> None:
        self.http.post("/v2/concurrency_limits/decrement-with-lease", json={"lease_id": lease}).raise_for_status()


@dataclass
class NativeStack:
    home: Path
    env: dict[str, str]  # the script's environment: STACK_HOME, the ports
    client_env: dict[str, str]  # what `scripts/stack.sh env` exports for lifecycle commands
    prefect: PrefectApi
    mlflow: str  # http://127.0.0.1:<port>
    gateway: str

    @classmethod
    @contextlib.contextmanager
    def start(
        cls, *, workers: int, base_config: Path, extra_env: dict[str, str] | None = None
    ) -> Iterator[NativeStack]:
        require_services()
        # not pytest's tmp_path: under root that is a 0700 folder the postgres user cannot enter
        home = Path(tempfile.mkdtemp(prefix="lifecycle-stack-"))
        home.chmod(0o755)
        ports = {
            name: str(free_port())
            for name in ("STACK_POSTGRES_PORT", "STACK_REDIS_PORT", "STACK_MLFLOW_PORT", "STACK_PREFECT_PORT")
        }
        ports["GATEWAY_PORT"] = str(free_port())  # HAProxy: the clients' address
        # gateway replicas listen on consecutive ports from this one
        ports["STACK_GATEWAY_REPLICA_PORT"] = str(free_port())
        # workers answer health checks on consecutive ports from this one
        ports["STACK_WORKER_HEALTH_PORT"] = str(free_port())
        for name in ("STACK_PROMETHEUS_PORT", "STACK_ALERTMANAGER_PORT", "STACK_WATCH_PORT"):
            ports[name] = str(free_port())
        env = {
            **{k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "LIFECYCLE_", "STACK_"))},
            **ports,
            "STACK_HOME": str(home),
            "STACK_WORKERS": str(workers),
            "STACK_BASE_CONFIG": str(base_config),
            **(extra_env or {}),
        }
        try:
            up = subprocess.run(["bash", str(STACK), "up"], capture_output=True, text=True, env=env, timeout=900)
            if up.returncode != 0:
                raise AssertionError(f"stack.sh up failed ({up.returncode}):\n{up.stdout}\n{up.stderr}")
            exported = subprocess.run(
                ["bash", str(STACK), "env"], capture_output=True, text=True, env=env, check=True
            ).stdout
            client_env = dict(
                line.removeprefix("export ").split("=", 1) for line in exported.splitlines() if line.strip()
            )
            yield cls(
                home=home,
                env=env,
                client_env=client_env,
                prefect=PrefectApi(f"http://127.0.0.1:{ports['STACK_PREFECT_PORT']}/api"),
                mlflow=f"http://127.0.0.1:{ports['STACK_MLFLOW_PORT']}",
                gateway=f"http://127.0.0.1:{ports['GATEWAY_PORT']}",
            )
        finally:
            down = subprocess.run(["bash", str(STACK), "down"], capture_output=True, text=True, env=env, timeout=300)
            print(down.stdout, down.stderr)  # how long each service took to stop (pytest -s shows it)
            shutil.rmtree(home, ignore_errors=True)

    @property
    def workers(self) -> list[str]:
        return [f"worker-{i}" for i in range(1, int(self.env["STACK_WORKERS"]) + 1)]

    def pgid(self, service: str) -> int:
        return int((self.home / "run" / f"{service}.pid").read_text())

    def kill(self, service: str) -> None:
        """SIGKILL to a service's whole process group, as when its machine or container is lost."""
        os.killpg(self.pgid(service), signal.SIGKILL)

    def secret(self, name: str) -> str:
        for line in (self.home / "secrets.env").read_text().splitlines():
            key, _, value = line.partition("=")
            if key == name:
                return value
        raise KeyError(name)

    def status(self) -> str:
        return subprocess.run(["bash", str(STACK), "status"], capture_output=True, text=True, env=self.env).stdout
