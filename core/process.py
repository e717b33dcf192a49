"""Servers the lifecycle starts as child processes (the gateway, a Prefect server, the MLflow UI), each in its own
process group so that stopping it stops everything it started.

    with ServerProcess("mlflow-ui", cmd, health_url=url + "/health", log_path=home.logs / "mlflow-ui.log") as ui:
        ...

Stopping signals the whole group: killing only the parent PID was seen to leave ``bentoml``'s worker and vLLM's
engine cores, and uvicorn's workers, running.

Dying with the parent, SIGKILL included (nothing runs in a process killed with -9, so it cannot stop its
children): a server child is started through a tiny exec wrapper that sets Linux's parent-death signal
(``prctl(PR_SET_PDEATHSIG, SIGKILL)``) before it becomes the server, so the kernel kills it when its parent
dies. Processes of ours deeper in a tree, started by a third party that puts them in sessions of their own (the
gateway's BentoML worker, and the vLLM engine cores it forks), call ``exit_with_parent``: a thread that sees the
process orphaned (its parent id changed) kills the process's whole group. The parent-death signal is not used for
those: it fires when the *thread* that forked the child ends, and vLLM starts engines from worker threads.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, Self

from core.errors import LifecycleError

ORPHAN_POLL_S = 0.25
# argv: PARENT_PID PROGRAM ARGS...: arm the parent-death signal, make sure the parent did not die before it was
# armed, then become the program (the signal setting survives exec)
_EXEC_WITH_PDEATHSIG = (
    "import ctypes, os, signal, sys\n"
    "ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)\n"
    "if os.getppid() != int(sys.argv[1]):\n"
    "    os._exit(1)\n"
    "os.execv(sys.argv[2], sys.argv[2:])\n"
)


def dying_with_parent(cmd: Sequence[str]) -> list[str]:
    """``cmd`` run so that the kernel kills it when this process dies, however it dies (Linux; elsewhere
    ``cmd`` unchanged). The program must be a path (``os.execv`` does not search PATH). Start it from a thread
    that lives as long as the child should (the main thread): the signal follows the thread that forked."""
    if not sys.platform.startswith("linux"):
        return list(cmd)
    return [sys.executable, "-c", _EXEC_WITH_PDEATHSIG, str(os.getpid()), *cmd]


_watching = False
_whole_group = True


def exit_with_parent(*, children_too: bool = True, whole_group: bool = True) -> None:
    """Kill this process's whole process group (only itself without ``whole_group``) as soon as this process is
    orphaned (its parent died: its parent id changes to a reaper's). With ``children_too``, every child this
    process forks from now on watches its own parent the same way (vLLM forks its engine cores: they die with the
    gateway worker that started them). Idempotent."""
    global _watching, _whole_group
    if _watching:
        return
    _watching = True
    _whole_group = whole_group
    _watch(os.getppid())
    if children_too:
        os.register_at_fork(after_in_child=_watch_in_child)


def _watch_in_child() -> None:
    global _watching
    _watching = True
    _watch(os.getppid())


def _watch(parent: int) -> None:
    def run() -> None:
        while os.getppid() == parent:
            time.sleep(ORPHAN_POLL_S)
        if _whole_group:  # our group holds the server's sockets and engines: all of it goes
            with contextlib.suppress(OSError):
                os.killpg(os.getpgrp(), signal.SIGKILL)
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=run, name="exit-with-parent", daemon=True).start()


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def port_in_use(host: str, port: int) -> bool:
    """Whether something listens on ``host:port`` (a bind with SO_REUSEADDR, as servers bind: a closed
    connection's TIME_WAIT does not count)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return True
    return False


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
        address: tuple[str, int] | None = None,
    ) -> None:
        self.name = name
        self.cmd = list(cmd)
        self.log_path = log_path
        self.health_url = health_url
        # where it will listen: ``address``, else the health URL's host and port. Checked free before starting: a
        # server already there would answer the readiness probe for this one, which then dies unable to bind
        url = urllib.parse.urlsplit(health_url) if health_url else None
        if address is None and url is not None and url.hostname and url.port:
            address = (url.hostname, url.port)
        self.address = address
        self.env = dict(env) if env is not None else None
        self.cwd = cwd
        self.proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    def start(self) -> Self:
        if self.address is not None and port_in_use(*self.address):
            host, port = self.address
            raise LifecycleError(
                f"{self.name} cannot start: {host}:{port} is already in use (another server listens there: stop it "
                "or choose another port)"
            )
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            dying_with_parent(self.cmd),
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=self.env,
            cwd=self.cwd,
            start_new_session=True,
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

    def stop(self, timeout_s: float = 10) -> None:
        """SIGTERM to the whole process group (graceful), SIGKILL to whatever is left in it after ``timeout_s``
        (compose's default stop grace: an MLflow server signalled while its job runner is still starting can
        ignore SIGTERM, and Ctrl-C of `lifecycle ui` must not wait half a minute per server for it)."""
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
