"""Process trees that die with their parent, SIGKILL included (``core.process``), on real processes: a child started
through ``dying_with_parent`` dies with its parent by the kernel's parent-death signal; a process in a session of
its own that calls ``exit_with_parent`` takes its process group (and the children it forked) down when orphaned."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from core.process import dying_with_parent

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux parent-death signals")
REPO = Path(__file__).resolve().parents[3]


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")  # a zombie has died and waits to be reaped


def wait_dead(pids: list[int], timeout_s: float = 20) -> list[int]:
    """The pids still alive after waiting (the bound is for a failing test only: death is seconds at most)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and any(alive(p) for p in pids):
        time.sleep(0.05)
    return [p for p in pids if alive(p)]


def start_parent(script: str) -> tuple[subprocess.Popen[str], dict[str, int]]:
    """A parent process running ``script``, which prints a JSON line of the pids it wants watched."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    parent = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(script)], stdout=subprocess.PIPE, text=True, env=env
    )
    assert parent.stdout is not None
    pids = json.loads(parent.stdout.readline())
    return parent, pids


def test_a_server_child_dies_with_its_parent_even_on_sigkill() -> None:
    parent, pids = start_parent(
        """
        import json, subprocess, time
        from core.process import dying_with_parent
        child = subprocess.Popen(dying_with_parent(["/bin/sleep", "300"]), start_new_session=True)
        print(json.dumps({"child": child.pid}), flush=True)
        time.sleep(300)
        """
    )
    child = pids["child"]
    deadline = time.monotonic() + 20
    while not Path(f"/proc/{child}/cmdline").read_bytes().startswith(b"/bin/sleep"):  # until the wrapper exec'd
        assert time.monotonic() < deadline and alive(child)
        time.sleep(0.01)
    os.kill(parent.pid, signal.SIGKILL)
    parent.wait()
    assert wait_dead([child]) == []


def test_an_orphaned_worker_takes_its_group_and_forked_children_down() -> None:
    """The gateway's shape: a supervisor starts a worker in a session of its own (as BentoML's circus does); the
    worker forks engine processes (as vLLM does). Killing the supervisor with SIGKILL leaves nothing behind."""
    worker = """
        import json, os, sys, time
        from core.process import exit_with_parent
        exit_with_parent()
        engine = os.fork()
        if engine == 0:
            time.sleep(300)
            os._exit(0)
        print(json.dumps({"worker": os.getpid(), "engine": engine}), flush=True)
        time.sleep(300)
    """
    parent, pids = start_parent(
        f"""
        import subprocess, sys, time
        proc = subprocess.Popen([sys.executable, "-c", {textwrap.dedent(worker)!r}], start_new_session=True)
        time.sleep(300)
        """
    )
    watched = [pids["worker"], pids["engine"]]
    assert all(alive(p) for p in watched)
    os.kill(parent.pid, signal.SIGKILL)
    parent.wait()
    assert wait_dead(watched) == []


def test_the_wrapper_is_transparent() -> None:
    out = subprocess.run(dying_with_parent(["/bin/echo", "hello", "world"]), capture_output=True, text=True, check=True)
    assert out.stdout == "hello world\n"


def test_an_orphaned_rank_in_its_launchers_group_takes_only_itself_down() -> None:
    """A fine-tune rank started in its launcher's process group (deepspeed's launcher does so; torchrun gives each
    rank a session): when the launcher dies the rank stops, and the rest of the group (here a sibling standing for
    ``lifecycle`` itself) lives on."""
    rank = """
        import json, os, time
        from core.process import exit_with_parent
        exit_with_parent(children_too=False, whole_group=os.getpgrp() == os.getpid())
        print(json.dumps({"rank": os.getpid()}), flush=True)
        time.sleep(300)
    """
    parent, pids = start_parent(
        f"""
        import json, subprocess, sys, time
        sibling = subprocess.Popen(["/bin/sleep", "300"])
        proc = subprocess.Popen([sys.executable, "-c", {textwrap.dedent(rank)!r}], stdout=subprocess.PIPE, text=True)
        rank = json.loads(proc.stdout.readline())["rank"]
        print(json.dumps({{"sibling": sibling.pid, "rank": rank}}), flush=True)
        time.sleep(300)
        """
    )
    try:
        # this parent plays the launcher: killing it orphans the rank
        assert alive(pids["rank"])
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait()
        assert wait_dead([pids["rank"]]) == []
        assert alive(pids["sibling"])  # same process group as the rank: untouched
    finally:
        os.kill(pids["sibling"], signal.SIGKILL)


def test_a_server_does_not_start_where_another_already_listens(tmp_path: Path) -> None:
    """A second server on a taken port used to be reported ready: the readiness probe reached the first one,
    and the new one died unable to bind. It now refuses to start, naming the address."""
    import socket

    from core.errors import LifecycleError
    from core.process import ServerProcess, port_in_use

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert port_in_use("127.0.0.1", port)
        cmd = [sys.executable, "-c", "import time; time.sleep(60)"]
        server = ServerProcess(
            "the test server", cmd, log_path=tmp_path / "s.log", health_url=f"http://127.0.0.1:{port}/"
        )
        with pytest.raises(LifecycleError, match=f"127.0.0.1:{port} is already in use"):
            server.start()
        assert server.proc is None  # nothing was started
        addressed = ServerProcess("the gateway", cmd, log_path=tmp_path / "g.log", address=("127.0.0.1", port))
        with pytest.raises(LifecycleError, match="the gateway cannot start"):
            addressed.start()
    assert not port_in_use("127.0.0.1", port)  # free again once the listener closed
