"""``kill -9`` of ``lifecycle serve`` takes its whole process tree with it (``bentoml serve``, its worker in a session
of its own, the vLLM engine cores and their workers), so its port is free at once (a restart there, answering and
stopped by Ctrl-C: ``-m slow``). The CLI as a user runs it, on the session gateway's home (its registry and keys),
with one engine: no fallback."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import httpx
import pytest
from support.cli_helpers import EXE, ctrl_c_reaches_it, user_env
from support.gateway_helpers import Gateway

from core.process import free_port
from flows.config import CONFIG_DIR


def _children(pid: int) -> list[int]:
    """Every live descendant of ``pid`` (from /proc)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError):
                parents[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
    out, frontier = [], [pid]
    while frontier:
        kids = [c for c, p in parents.items() if p in frontier]
        out += kids
        frontier = kids
    return out


def _alive(pid: int) -> bool:
    try:
        return (Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]) not in ("Z", "X")
    except OSError:
        return False


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server binds it
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def _serve(home: Path, port: int, log: Path) -> subprocess.Popen[bytes]:
    cmd = [str(EXE), "serve", "--config", str(CONFIG_DIR / "tiny.yaml"), "--home", str(home), "--port", str(port)]
    cmd += ["--set", "serving.routing.fallback=null"]
    with log.open("ab") as out:
        return subprocess.Popen(
            cmd,
            env=user_env(home),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=ctrl_c_reaches_it,
        )


def _wait_ready(url: str, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        assert proc.poll() is None, log.read_text()[-3000:]
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url + "/readyz", timeout=5).status_code == 200:
                return
        time.sleep(0.5)
    raise AssertionError(f"lifecycle serve was not ready: {log.read_text()[-3000:]}")


def _killed(home: Path, port: int, log: Path) -> None:
    """Start ``lifecycle serve``, ``kill -9`` it, and assert its whole tree is gone and its port free."""
    url = f"http://127.0.0.1:{port}"
    first = _serve(home, port, log)
    try:
        _wait_ready(url, first, log)
        tree = _children(first.pid)
        engines = httpx.get(url + "/readyz", timeout=10).json()["engines"]
        engine_pids = [p for e in engines.values() for p in e["pids"]]
        assert engine_pids and set(engine_pids) <= set(tree), (engine_pids, tree)  # engines are in the tree
        os.kill(first.pid, signal.SIGKILL)
        first.wait()
        deadline = time.monotonic() + 60
        while (any(_alive(p) for p in tree) or not _port_free(port)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert [p for p in tree if _alive(p)] == [], "processes of the killed server are still running"
        assert _port_free(port)
    finally:
        if first.poll() is None:  # the test failed before its kill: the same kill cleans up
            os.kill(first.pid, signal.SIGKILL)
            first.wait()


def test_kill_9_takes_the_whole_tree_and_frees_the_port(gateway: Gateway, tmp_path: Path) -> None:
    _killed(gateway.home.root, free_port(), tmp_path / "serve.log")


@pytest.mark.slow  # a second server start (~1 min); the test above proves the port free and no process left
def test_a_restart_on_the_killed_servers_port_answers_and_ctrl_c_stops_it(gateway: Gateway, tmp_path: Path) -> None:
    home, port, log = gateway.home.root, free_port(), tmp_path / "serve.log"
    url = f"http://127.0.0.1:{port}"
    _killed(home, port, log)
    second = _serve(home, port, log)  # the same port, at once
    try:
        _wait_ready(url, second, log)
        answer = httpx.post(
            url + "/v1/chat/completions",
            json={"model": "chat", "messages": [{"role": "user", "content": "What is 2 + 2?"}], "max_tokens": 4},
            headers={"Authorization": f"Bearer {gateway.api_key}"},
            timeout=120,
        )
        assert answer.status_code == 200, answer.text
        tree = _children(second.pid)
    finally:
        second.send_signal(signal.SIGINT)  # Ctrl-C: the normal way out
        try:
            second.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(second.pid, signal.SIGKILL)
            second.wait()
    deadline = time.monotonic() + 60
    while any(_alive(p) for p in tree) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert [p for p in tree if _alive(p)] == []


def test_a_second_server_on_a_taken_port_refuses_in_one_line(gateway: Gateway, tmp_path: Path) -> None:
    """``lifecycle serve`` on the port the session gateway holds: it used to print "gateway ready" (its probe reached
    the running gateway while its own server died unable to bind). It refuses, in one line, exit 1, and the running
    gateway keeps answering."""
    port = int(gateway.url.rsplit(":", 1)[1])
    log = tmp_path / "second.log"
    second = _serve(gateway.home.root, port, log)
    assert second.wait(300) == 1, log.read_text()
    out = log.read_text()
    assert "gateway ready" not in out
    errors = [line for line in out.splitlines() if line.startswith("lifecycle: error:")]
    assert errors == [
        f"lifecycle: error: the gateway cannot start: 127.0.0.1:{port} is already in use "
        "(another server listens there: stop it or choose another port)"
    ], out
    assert "Traceback" not in out
    assert httpx.get(gateway.url + "/readyz", timeout=10).status_code == 200
