"""Multi-node fine-tuning, run for real: two "nodes" as Linux network namespaces joined by a veth pair
(10.77.0.1 and 10.77.0.2, ``netns_helpers``), one DeepSpeed rank each, launched the way an operator launches
them: ``lifecycle train`` on node 0 with ``finetune.distributed.nnodes=2`` (torchrun's static rendezvous at node
0's address), ``lifecycle train-node RUN_DIR --node-rank 1`` on node 1; the run folder is on a filesystem both
see (here: the same disk).

One node's rank is killed mid-run (SIGKILL, where the test hook paused it right after its first checkpoint):
node 1 reports it in one line (which node, which rank, the signal, the exit code), node 0 names it as the cause
of its own rank's failure, and the run resumes from the checkpoint when node 1 is started again (node 0's
fine-tune task retries once by itself and waits for it at the rendezvous). The weights are bit for bit those of
the same config on one node with two ranks.

Needs root (namespaces); skipped with the reason otherwise. Marked slow (its own part took 3.5 min on a loaded
2-core machine): the default run proves a killed fine-tune's resume on one node (tests/e2e/test_newcomer.py).
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import re
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.cli_helpers import EXE, paused_after_first_checkpoint, user_env
from support.netns_helpers import IFNAME, Node, two_nodes, unavailable

from flows.config import CONFIG_DIR, LifecycleConfig

TINY = str(CONFIG_DIR / "tiny.yaml")
STEPS = 20  # checkpoints every 4 (tiny.yaml): node 1's rank pauses after the first and is killed there
SAME = ["--set", f"finetune.max_steps={STEPS}", "--set", "finetune.distributed.threads_per_rank=1"]


@pytest.fixture(scope="module")
def nodes() -> Iterator[tuple[Node, Node]]:
    why = unavailable()
    if why:
        pytest.skip(why)
    with two_nodes() as pair:
        yield pair


class Lines:
    """A process's stderr, read as it comes."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.proc, self.seen, self._q = proc, [], queue.Queue()  # type: ignore[var-annotated]
        assert proc.stderr is not None
        stream = proc.stderr
        threading.Thread(target=lambda: [self._q.put(line) for line in stream], daemon=True).start()

    def wait_for(self, pattern: str, timeout_s: float) -> re.Match[str]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for line in self.seen:
                if m := re.search(pattern, line):
                    return m
            with contextlib.suppress(queue.Empty):
                self.seen.append(self._q.get(timeout=1))
        raise AssertionError(f"no line matching {pattern!r}:\n{''.join(self.seen)[-4000:]}")

    def text(self) -> str:
        while not self._q.empty():
            self.seen.append(self._q.get())
        return "".join(self.seen)


def start(node: Node, *args: str, home: Path, pause: bool = False) -> Lines:
    """``lifecycle *args`` in the node; with ``pause``, its rank waits for good after its first checkpoint
    (training.finetune.faults), so the kill lands mid-run however fast the machine trains."""
    env = user_env(home)
    proc = subprocess.Popen(
        node.wrap([str(EXE), *args, "--home", str(home)]),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=paused_after_first_checkpoint(env) if pause else env,
    )
    return Lines(proc)


def rank_pid(node: Node) -> int:
    """The training rank in the node (not torchrun's agent, whose command line names the worker module too)."""
    for pid in node.pids():
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().split(b"\0")
        if b"training.finetune.worker" in argv and b"training.finetune.node" not in argv:
            return pid
    raise AssertionError(f"no rank running in {node.netns}")


@pytest.mark.slow
def test_two_nodes_train_one_nodes_weights_and_a_killed_rank_is_named_and_resumed(
    nodes: tuple[Node, Node], tiny_config: LifecycleConfig, tiny_snapshot: Any, tiny_base_model: Any, tmp_path: Path
) -> None:
    from training.finetune.launch import finetune

    a, b = nodes
    # the reference: the same config on one node, two ranks
    ft = tiny_config.finetune.model_copy(
        update={
            "max_steps": STEPS,
            "distributed": tiny_config.finetune.distributed.model_copy(update={"threads_per_rank": 1}),
        }
    )
    reference = finetune(ft, tiny_snapshot, tiny_base_model, tmp_path / "one-node")
    assert reference.report.world_size == 2

    home = tmp_path / "home"  # both nodes' $LIFECYCLE_HOME (a shared filesystem in a real cluster)
    multi = ["--set", "finetune.distributed.nnodes=2", "--set", "finetune.distributed.world_size=1"]
    multi += ["--set", f"finetune.distributed.master_addr={a.address}"]
    multi += ["--set", f"finetune.distributed.socket_ifname={IFNAME}"]
    base = ["--set", f"base_model={tiny_base_model.path}"]
    node0 = start(a, "train", "--config", TINY, *SAME, *multi, *base, "--json", home=home)
    try:
        run_dir = Path(node0.wait_for(r"lifecycle train-node (\S+) --node-rank 1", 300)[1])
        node1 = start(b, "train-node", str(run_dir), "--node-rank", "1", home=home, pause=True)
        deadline = time.monotonic() + 300
        while not (run_dir / "checkpoints" / "latest").is_file():
            assert node0.proc.poll() is None and node1.proc.poll() is None, node0.text()[-3000:]
            assert time.monotonic() < deadline, "no checkpoint in time"
            time.sleep(0.05)
        victim = rank_pid(b)
        os.kill(victim, signal.SIGKILL)

        # node 1 says what happened to its rank, in one line
        assert node1.proc.wait(timeout=120) == 1
        said = f"node 1 ({b.address}): rank 1 (pid {victim}) was killed by SIGKILL (exit code -9)"
        assert f"fine-tune: {said}\n" in node1.text()
        error = [line for line in node1.text().splitlines() if line.startswith("lifecycle: error:")]
        assert error and said in error[0] and "resumable from step" in error[0], node1.text()[-2000:]
        # node 0 names node 1's rank as the cause of its own rank's failure, then retries, waiting for node 1
        cause = node0.wait_for(r"fine-tuning failed: (.*?); then (node 0 \(\S+\): rank 0 .*?exited with code \d+)", 120)
        assert cause[1] == said and a.address in cause[2]
        step = int(node0.wait_for(r"resumable from step (\d+)", 10)[1])
        node0.wait_for(r"Retry 1/1", 60)
        assert step >= 4

        # node 1 started again: the run resumes from the checkpoint and ends where one node ends
        node1 = start(b, "train-node", str(run_dir), "--node-rank", "1", home=home)
        assert node1.proc.wait(timeout=600) == 0, node1.text()[-3000:]
        assert node0.proc.wait(timeout=600) == 0, node0.text()[-3000:]
    finally:
        for proc in (node0.proc,):
            if proc.poll() is None:
                proc.kill()
    assert node0.proc.stdout is not None
    summary = json.loads(node0.proc.stdout.read())
    result = json.loads((run_dir / "train_result.json").read_text())
    assert result["world_size"] == 2 and result["resumed_from_step"] == step >= 4
    assert result["weights_hash"] == reference.weights_hash  # bit-identical to the one-node run
    assert summary["lineage"]["weights_hash"] == reference.weights_hash  # and that is what was registered
    reports = {k: json.loads((run_dir / "nodes" / f"node-{k}.json").read_text()) for k in (0, 1)}
    assert [reports[k]["address"] for k in (0, 1)] == [a.address, b.address]
    assert reports[0]["failures"] == reports[1]["failures"] == []  # the resumed attempt ended cleanly
