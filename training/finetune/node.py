"""One node's ranks of a fine-tune under torchrun's agent, and a report of how they ended.

    python -m training.finetune.node --report RUN_DIR/nodes/node-0.json -- \\
        --nnodes=2 --node_rank=0 --nproc_per_node=1 --master_addr=10.77.0.1 --master_port=29500 \\
        -m training.finetune.worker RUN_DIR/job.json

``training/finetune/launch.py`` starts it (``launch_command``) on node 0, and ``lifecycle train-node`` on the others.
It runs torchrun's agent in this process rather than as a command, so a rank that dies comes back as torchrun's
structured ``ChildFailedError`` (global rank, local rank, pid, exit code, the signal that killed it) instead of
a banner on stderr. It writes the report (JSON, in the run folder every node shares) either way and, when a rank
failed, prints one line saying which node, which rank and how, then exits 1. Node 0 reads every node's report to
name the rank whose failure took the others down (``failure_line``).
"""

from __future__ import annotations

import argparse
import json
import signal
import socket
import sys
import time
from pathlib import Path
from typing import Any

REPORT_DIR = "nodes"


def report_path(run_dir: Path, node_rank: int) -> Path:
    return run_dir / REPORT_DIR / f"node-{node_rank}.json"


def _address(master_addr: str, port: int) -> str:
    """This node's address on the route to rank 0 (a UDP connect sends nothing)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((master_addr, port))
            return str(s.getsockname()[0])
    except OSError:
        return socket.gethostname()


def _failure(rank: int, failure: Any) -> dict[str, Any]:  # a torch ProcessFailure
    code = int(failure.exitcode)
    return {
        "rank": rank,
        "local_rank": int(failure.local_rank),
        "pid": int(failure.pid),
        "exitcode": code,
        "signal": signal.Signals(-code).name if code < 0 and -code in signal.valid_signals() else None,
        "at": float(failure.timestamp),
    }


def describe(node: dict[str, Any], failure: dict[str, Any]) -> str:
    how = (
        f"was killed by {failure['signal']} (exit code {failure['exitcode']})"
        if failure["signal"]
        else f"exited with code {failure['exitcode']}"
    )
    return f"node {node['node_rank']} ({node['address']}): rank {failure['rank']} (pid {failure['pid']}) {how}"


def root_cause(reports: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """The (node, failure) that took the run down: a rank killed by a signal first (its peers then fail on a
    closed connection, with exit code 1), else the earliest failure."""
    failed = [(n, f) for n in reports for f in n["failures"]]
    if not failed:
        return None
    return min(failed, key=lambda nf: (nf[1]["signal"] is None, nf[1]["at"]))


def failure_line(reports: list[dict[str, Any]]) -> str | None:
    """One line: the root cause, then how every other node's ranks ended."""
    cause = root_cause(reports)
    if cause is None:
        return None
    node, failure = cause
    others = [describe(n, f) for n in reports for f in n["failures"] if f is not failure]
    return describe(node, failure) + (f"; then {'; '.join(others)}" if others else "")


def run_node(report: Path, torchrun_args: list[str]) -> int:
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args, run

    args = parse_args(torchrun_args)
    node: dict[str, Any] = {
        "node_rank": int(args.node_rank),
        "host": socket.gethostname(),
        "address": _address(args.master_addr, int(args.master_port or 29500)),
        "started": time.time(),
        "failures": [],
    }
    report.parent.mkdir(parents=True, exist_ok=True)
    report.unlink(missing_ok=True)  # an earlier attempt's report says nothing about this one
    code = 0
    try:
        run(args)
    except ChildFailedError as exc:
        node["failures"] = [_failure(rank, f) for rank, f in sorted(exc.failures.items())]
        code = 1
    node["ended"] = time.time()
    tmp = report.with_suffix(".tmp")
    tmp.write_text(json.dumps(node, indent=2) + "\n", encoding="utf-8")
    tmp.replace(report)
    if code:
        print(f"fine-tune: {failure_line([node])}", file=sys.stderr, flush=True)
    return code


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m training.finetune.node", description=__doc__.split("\n")[0])
    parser.add_argument("--report", required=True, type=Path, help="where this node's report is written (JSON)")
    parser.add_argument("torchrun", nargs=argparse.REMAINDER, help="-- then torchrun's arguments")
    args = parser.parse_args(argv)
    torchrun = args.torchrun[1:] if args.torchrun[:1] == ["--"] else args.torchrun
    return run_node(args.report, torchrun)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
