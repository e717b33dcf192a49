"""Start and stop ``bentoml serve`` for the gateway: used by ``lifecycle serve``, the tests and the benchmarks.

    with GatewayProcess(spec, home) as gw:       # writes the spec, starts bentoml serve, waits for /readyz
        openai.OpenAI(base_url=gw.url + "/v1", api_key=...)

The server runs in its own process group and is stopped by signalling the group: killing only the ``bentoml``
PID was seen to leave its worker and the vLLM engine running.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import IO, Any

from core.errors import LifecycleError
from core.hashing import sha256_json
from core.home import Home
from core.runtime import runtime_environment
from serving.runtime import SPEC_ENV, ServeSpec

REPO = Path(__file__).resolve().parent.parent
SERVICE = "serving.service:ChatGateway"


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def write_spec(spec: ServeSpec, home: Home) -> Path:
    """The spec file the service reads, named by its content (two gateways with one config share it)."""
    data = spec.model_dump(mode="json")
    path = home.serving / f"spec-{sha256_json(data)[:12]}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2), encoding="utf-8")
    return path


class GatewayProcess:
    def __init__(self, spec: ServeSpec, *, log_path: Path | None = None, env: dict[str, str] | None = None) -> None:
        self.spec = spec
        self.home = Home(Path(spec.home))
        self.host = spec.serving.host
        self.port = spec.serving.port or free_port(self.host)
        self.log_path = log_path or self.home.logs / f"gateway-{self.port}.log"
        self.extra_env = env or {}
        self.proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> GatewayProcess:
        spec_path = write_spec(self.spec, self.home)
        env = {**os.environ, **runtime_environment(self.home), **self.extra_env, SPEC_ENV: str(spec_path)}
        env.setdefault("LIFECYCLE_HOME", str(self.home.root))
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
        bentoml = Path(sys.executable).with_name("bentoml")
        cmd = [
            str(bentoml),
            "serve",
            SERVICE,
            "--host",
            self.host,
            "--port",
            str(self.port),
            "--working-dir",
            str(REPO),
        ]
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = self.log_path.open("ab")
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        return self

    def readiness(self) -> tuple[int, dict[str, Any]]:
        try:
            with urllib.request.urlopen(self.url + "/readyz", timeout=5) as r:
                return r.status, json.loads(r.read() or b"{}")
        except urllib.error.HTTPError as exc:
            try:
                return exc.code, json.loads(exc.read() or b"{}")
            except json.JSONDecodeError:
                return exc.code, {}
        except (OSError, json.JSONDecodeError):
            return 0, {}

    def wait_ready(self, timeout_s: float = 600) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        body: dict[str, Any] = {}
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise LifecycleError(f"the gateway exited with code {self.proc.returncode}; log: {self.log_path}")
            status, body = self.readiness()
            if status == 200:
                return body
            if body.get("status") == "failed":
                raise LifecycleError(
                    f"the gateway could not load its models: {body.get('error')} (log: {self.log_path})"
                )
            time.sleep(1)
        raise LifecycleError(f"the gateway was not ready after {timeout_s:.0f} s ({body}); log: {self.log_path}")

    def stop(self, timeout_s: float = 30) -> None:
        """SIGTERM to the whole process group (graceful: engines shut down), SIGKILL if it lingers."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            with contextlib.suppress(subprocess.TimeoutExpired, ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(timeout=timeout_s)
        with contextlib.suppress(ProcessLookupError, PermissionError):  # what is left in the group (engine cores)
            os.killpg(self.proc.pid, signal.SIGKILL)
        if self.proc.poll() is None:
            self.proc.wait(timeout=10)
        if self._log is not None:
            self._log.close()
        self.proc = None

    def __enter__(self) -> GatewayProcess:
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
