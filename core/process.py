"""Servers the lifecycle starts as child processes (the gateway, a Prefect server, the MLflow UI), each in its own
process group so that stopping it stops everything it started.

    with ServerProcess("mlflow-ui", cmd, health_url=url + "/health", log_path=home.logs / "mlflow-ui.log") as ui:
        ...

Stopping signals the whole group: killing only the parent PID was seen to leave ``bentoml``'s worker and vLLM's
engine cores, and uvicorn's workers, running.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, Self

from core.errors import LifecycleError


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class ServerProcess:
    """A child server: started in a new session, ready when ``health_url`` answers 200, stopped by group."""

    def __init__(
        self,
        name: str,
        cmd: Sequence[str],
        *,
        log_path: Path,
        health_url: str | None = None,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
    ) -> None:
        self.name = name
        self.cmd = list(cmd)
        self.log_path = log_path
        self.health_url = health_url
        self.env = dict(env) if env is not None else None
        self.cwd = cwd
        self.proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    def start(self) -> Self:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            self.cmd, stdout=self._log, stderr=subprocess.STDOUT, env=self.env, cwd=self.cwd, start_new_session=True
        )
        return self

    def ready(self) -> bool:
        """One readiness probe; subclasses with a richer health answer override it (and may raise)."""
        if self.health_url is None:
            return True
        try:
            with urllib.request.urlopen(self.health_url, timeout=5) as r:
                return bool(r.status == 200)
        except (OSError, urllib.error.HTTPError):
            return False

    def wait_ready(self, timeout_s: float = 300) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise LifecycleError(f"{self.name} exited with code {self.proc.returncode}; log: {self.log_path}")
            if self.ready():
                return
            time.sleep(0.5)
        raise LifecycleError(f"{self.name} was not ready after {timeout_s:.0f} s; log: {self.log_path}")

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout_s: float = 30) -> None:
        """SIGTERM to the whole process group (graceful), SIGKILL to whatever is left in it."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            with contextlib.suppress(subprocess.TimeoutExpired, ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(timeout=timeout_s)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        if self.proc.poll() is None:
            self.proc.wait(timeout=10)
        if self._log is not None:
            self._log.close()
        self.proc = None

    def __enter__(self) -> Self:
        self.start()
        try:
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
