"""Two "nodes" on one machine: Linux network namespaces joined by a veth pair, each with an address of its own.

    with two_nodes() as (a, b):                   # a: 10.77.0.1 on lc0 in its namespace, b: 10.77.0.2
        subprocess.run(a.wrap(["python", "-c", "..."]))    # runs inside a's namespace (ip netns exec)

Each namespace has only its loopback and its end of the pair (named ``lc0`` in both, so one config names the
interface for every node); nothing is routed to the host's network. The namespaces, the pair and every process
left inside them are removed on exit. Needs root and ``ip`` (iproute2); ``unavailable()`` says why not.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

IFNAME = "lc0"
SUBNET = "10.77.0"


def unavailable() -> str | None:
    """Why namespaces cannot be made here, or None."""
    if os.geteuid() != 0:
        return "network namespaces need root (ip netns add)"
    if shutil.which("ip") is None:
        return "no 'ip' command (Debian's iproute2; scripts/install-services.sh installs it)"
    probe = f"lcprobe{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"ip netns add failed: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


@dataclass(frozen=True)
class Node:
    netns: str
    address: str

    def wrap(self, argv: Sequence[str]) -> list[str]:
        """``argv`` run inside this node's namespace."""
        return ["ip", "netns", "exec", self.netns, *argv]

    def pids(self) -> list[int]:
        out = subprocess.run(["ip", "netns", "pids", self.netns], capture_output=True, text=True).stdout
        return [int(p) for p in out.split()]


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


def _empty(node: Node) -> None:
    """SIGKILL whatever still runs in the namespace (a test that failed half-way)."""
    for _ in range(50):
        pids = node.pids()
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.1)


@contextlib.contextmanager
def two_nodes() -> Iterator[tuple[Node, Node]]:
    tag = f"lc{os.getpid()}"
    nodes = (Node(f"{tag}n0", f"{SUBNET}.1"), Node(f"{tag}n1", f"{SUBNET}.2"))
    made: list[Node] = []
    try:
        for node in nodes:
            _ip("netns", "add", node.netns)
            made.append(node)
        # the pair is created in the host's namespace under unique names, then each end moves into its node
        _ip("link", "add", f"{tag}a", "type", "veth", "peer", "name", f"{tag}b")
        for node, end in zip(nodes, (f"{tag}a", f"{tag}b"), strict=True):
            _ip("link", "set", end, "netns", node.netns)
            _ip("-n", node.netns, "link", "set", end, "name", IFNAME)
            _ip("-n", node.netns, "addr", "add", f"{node.address}/24", "dev", IFNAME)
            _ip("-n", node.netns, "link", "set", IFNAME, "up")
            _ip("-n", node.netns, "link", "set", "lo", "up")
        yield nodes
    finally:
        for node in made:
            _empty(node)
            # deleting a namespace destroys the pair's end in it, and with it the pair
            subprocess.run(["ip", "netns", "del", node.netns], capture_output=True)
