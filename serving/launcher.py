"""Start and stop ``bentoml serve`` for the gateway: used by ``lifecycle serve``, the tests and the benchmarks.

    with GatewayProcess(spec, home) as gw:       # writes the spec, starts bentoml serve, waits for /readyz
        openai.OpenAI(base_url=gw.url + "/v1", api_key=...)

The server runs in its own process group and is stopped by signalling the group (``core.process``): killing
only the ``bentoml`` PID was seen to leave its worker and the vLLM engine running.
"""

from __future__ import annotations

import json
import os
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Self

from core.errors import LifecycleError
from core.hashing import sha256_json
from core.home import Home
from core.process import ServerProcess, free_port
from core.runtime import runtime_environment
from serving.runtime import SPEC_ENV, ServeSpec

REPO = Path(__file__).resolve().parent.parent
SERVICE = "serving.service:ChatGateway"


def write_spec(spec: ServeSpec, home: Home) -> Path:
    """The spec file the service reads, named by its content (two gateways with one config share it)."""
    data = spec.model_dump(mode="json")
    path = home.serving / f"spec-{sha256_json(data)[:12]}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2), encoding="utf-8")
    return path


class GatewayProcess(ServerProcess):
    def __init__(self, spec: ServeSpec, *, log_path: Path | None = None, env: dict[str, str] | None = None) -> None:
        self.spec = spec
        self.home = Home(Path(spec.home))
        self.host = spec.serving.host
        self.port = spec.serving.port or free_port(self.host)
        self.extra_env = env or {}
        bentoml = Path(sys.executable).with_name("bentoml")
        cmd = [str(bentoml), "serve", SERVICE, "--host", self.host, "--port", str(self.port)]
        cmd += ["--working-dir", str(REPO)]
        log = log_path or self.home.logs / f"gateway-{self.port}.log"
        super().__init__("the gateway", cmd, log_path=log, address=(self.host, self.port))
        self._body: dict[str, Any] = {}

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> Self:
        spec_path = write_spec(self.spec, self.home)
        env = {**os.environ, **runtime_environment(self.home), **self.extra_env, SPEC_ENV: str(spec_path)}
        env.setdefault("LIFECYCLE_HOME", str(self.home.root))
        # BentoML keeps its Prometheus multiprocess files under $BENTOML_HOME and wipes them when a server starts:
        # with one shared folder (~/bentoml), every gateway on the machine erased the others' engine metrics (and
        # read them as its own). Each gateway (a home and a port: unique among live servers) gets its own.
        env["BENTOML_HOME"] = str(self.home.serving / f"bentoml-{self.port}")
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
        self.env = env
        return super().start()

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

    def ready(self) -> bool:
        status, self._body = self.readiness()
        if status != 200 and self._body.get("status") == "failed":
            raise LifecycleError(
                f"the gateway could not load its models: {self._body.get('error')} (log: {self.log_path})"
            )
        return status == 200

    @property
    def last_readiness(self) -> dict[str, Any]:
        """The /readyz body of the last probe (after ``wait_ready``: what the ready gateway serves)."""
        return self._body

    def wait_ready(self, timeout_s: float = 600) -> None:
        try:
            super().wait_ready(timeout_s)
        except LifecycleError as exc:
            if "was not ready" in str(exc):
                raise LifecycleError(f"{exc} (last /readyz: {self._body})") from None
            raise
