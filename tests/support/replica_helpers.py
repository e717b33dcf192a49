"""Gateway replicas behind HAProxy for the e2e test (tests/e2e/test_gateway_replicas.py): Redis, HAProxy on
infra/haproxy/haproxy.cfg, and ``lifecycle serve`` processes, each on 127.0.0.1 on free ports.

    with RedisServer.start(root) as redis:                      # stopped on exit
        a = Replica(config, home, overrides, log).start()       # lifecycle serve --port <free>; a.stop() stops it
        a.wait_ready()
        with LoadBalancer.start([a.address, b.address], root) as lb:
            httpx.post(lb.url + "/v1/chat/completions", ...)   # header x-gateway-replica: gateway-1 or gateway-2
            a.kill()                                         # SIGKILL: the CLI, its bentoml server and engines

Debian's redis-server and haproxy come from ``scripts/install-services.sh``; ``stack_helpers.Unavailable`` says why
they could not be had (the test skips with it).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self

import httpx

from core.process import free_port
from support.cli_helpers import EXE, user_env
from support.stack_helpers import INSTALL, Unavailable, wait_for

REPO = Path(__file__).resolve().parents[2]
HAPROXY_CFG = REPO / "infra" / "haproxy" / "haproxy.cfg"
# httplog: ... termination actconn/feconn/beconn/srv_conn/retries srv_queue/backend_queue "request"
RETRIES = re.compile(r" \d+/\d+/\d+/\d+/(\+?\d+) \d+/\d+ \"")


def require_balancer() -> None:
    """redis-server and haproxy on PATH, installed with scripts/install-services.sh when missing."""
    if shutil.which("redis-server") and shutil.which("haproxy"):
        return
    proc = subprocess.run(["bash", str(INSTALL)], capture_output=True, text=True, timeout=900)
    if proc.returncode != 0 or not (shutil.which("redis-server") and shutil.which("haproxy")):
        why = (proc.stderr.strip().splitlines() or [f"exit code {proc.returncode}"])[-1]
        raise Unavailable(f"redis-server/haproxy are not installed and {INSTALL.name} failed: {why}")


@contextlib.contextmanager
def _process(argv: list[str], log: Path, env: dict[str, str] | None = None) -> Iterator[subprocess.Popen[bytes]]:
    """A server in a process group of its own, TERM then KILL to the group on exit."""
    with log.open("ab") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        yield proc
    finally:
        _stop_group(proc)


def _stop_group(proc: subprocess.Popen[bytes], timeout_s: float = 60) -> None:
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@dataclass
class RedisServer:
    url: str

    @classmethod
    @contextlib.contextmanager
    def start(cls, root: Path) -> Iterator[RedisServer]:
        port = free_port()
        argv = ["redis-server", "--save", "", "--appendonly", "no", "--bind", "127.0.0.1", "--port", str(port)]
        argv += ["--dir", str(root)]
        with _process(argv, root / "redis.log") as proc:
            redis_cli = ["redis-cli", "-h", "127.0.0.1", "-p", str(port), "ping"]

            def pong() -> bool:
                assert proc.poll() is None, f"redis-server exited: {(root / 'redis.log').read_text()[-2000:]}"
                return subprocess.run(redis_cli, capture_output=True, text=True).stdout.strip() == "PONG"

            wait_for("redis-server", pong, 30, 0.1)
            yield cls(f"redis://127.0.0.1:{port}/0")


@dataclass
class LoadBalancer:
    """HAProxy on the shipped config; ``log`` holds its request log (one line per request, retries marked)."""

    url: str
    log: Path

    @classmethod
    @contextlib.contextmanager
    def start(cls, replicas: list[str], root: Path) -> Iterator[LoadBalancer]:
        port = free_port()
        env = {**os.environ, "LB_BIND": f"127.0.0.1:{port}", "GATEWAY_1": replicas[0], "GATEWAY_2": replicas[1]}
        log = root / "haproxy.log"
        with _process(["haproxy", "-W", "-db", "-f", str(HAPROXY_CFG)], log, env) as proc:
            lb = cls(f"http://127.0.0.1:{port}", log)

            def both_up() -> bool:  # each replica has answered through the balancer
                assert proc.poll() is None, f"haproxy exited: {log.read_text()[-2000:]}"
                seen = set()
                for _ in range(6):
                    with contextlib.suppress(httpx.HTTPError):
                        r = httpx.get(lb.url + "/healthz", timeout=5)
                        seen.add(r.headers.get("x-gateway-replica"))
                return {"gateway-1", "gateway-2"} <= seen

            wait_for("both replicas behind haproxy", both_up, 60, 0.5)
            yield lb

    def retried_lines(self) -> list[str]:
        """Request-log lines of requests HAProxy sent again: the retries field (after the connection counts) is
        N > 0 after a retry on the same replica, "+N" after a redispatch to another one."""
        out = []
        for line in self.log.read_text(errors="replace").splitlines():
            m = RETRIES.search(line)
            if m and m.group(1) != "0":
                out.append(line)
        return out


class Replica:
    """``lifecycle serve --config CONFIG --port PORT``: the CLI as an operator runs it, waiting on its bentoml
    server (a process group of its own, engines included)."""

    def __init__(self, config: Path, home: Path, overrides: list[str], log: Path) -> None:
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.url = f"http://{self.address}"
        self.log = log
        argv = [str(EXE), "serve", "--config", str(config), "--home", str(home), "--port", str(self.port)]
        for override in overrides:
            argv += ["--set", override]
        self.argv = argv
        self.env = user_env(home)
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Self:
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                self.argv, stdout=out, stderr=subprocess.STDOUT, env=self.env, start_new_session=True
            )
        return self

    def readiness(self) -> dict[str, Any] | None:
        """The /readyz body while the replica is ready, else None."""
        try:
            r = httpx.get(self.url + "/readyz", timeout=5)
        except httpx.HTTPError:
            return None
        return dict(r.json()) if r.status_code == 200 else None

    def wait_ready(self, timeout_s: float = 600) -> None:
        def ready() -> dict[str, Any] | None:
            assert self.proc is not None and self.proc.poll() is None, (
                f"lifecycle serve exited ({self.proc and self.proc.returncode}):\n{self.log.read_text()[-3000:]}"
            )
            return self.readiness()

        wait_for(f"replica {self.address}", ready, timeout_s, 0.5)

    def server_groups(self) -> list[int]:
        """Process groups of the CLI's children (the bentoml server runs in a session of its own)."""
        assert self.proc is not None
        groups = set()
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            if int(fields[1]) == self.proc.pid:  # ppid
                groups.add(int(fields[2]))  # pgrp
        return sorted(groups)

    def kill(self) -> None:
        """SIGKILL to the replica's every process at once, as when its machine or container is lost."""
        assert self.proc is not None
        groups = self.server_groups()
        assert groups, "the replica's bentoml server was not found"
        for group in [self.proc.pid, *groups]:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(group, signal.SIGKILL)
        self.proc.wait()
        # the engine core processes die with their parent (core.process.exit_with_parent): the port frees up
        wait_for(f"replica {self.address} gone", lambda: self._refused(), 60, 0.2)

    def _refused(self) -> bool:
        try:
            httpx.get(self.url + "/healthz", timeout=2)
        except httpx.ConnectError:
            return True
        except httpx.HTTPError:
            return False
        return False

    def stop(self) -> None:
        """TERM to the CLI: it stops its bentoml server's group (flows.commands.serve), then is waited for."""
        if self.proc is not None:
            groups = self.server_groups() if self.proc.poll() is None else []
            _stop_group(self.proc, timeout_s=90)
            for group in groups:  # should be none left; never leave one running
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(group, signal.SIGKILL)
