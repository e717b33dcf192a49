"""How a fine-tune's failure is reported: each node's report of its ranks (``training/finetune/node.py``) and the one
line node 0 makes of them, naming the rank whose death took the others down."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

from training.config import FinetuneConfig
from training.finetune.launch import _failed, node_reports
from training.finetune.node import _failure, failure_line, report_path, root_cause


def node(rank: int, address: str, *failures: dict[str, Any], ended: float = 0.0) -> dict[str, Any]:
    return {"node_rank": rank, "address": address, "failures": list(failures), "started": 0.0, "ended": ended}


def failure(rank: int, exitcode: int, at: float, signal: str | None = None) -> dict[str, Any]:
    return {"rank": rank, "local_rank": 0, "pid": 1000 + rank, "exitcode": exitcode, "signal": signal, "at": at}


def test_torchruns_failure_becomes_rank_pid_exit_code_and_signal() -> None:
    killed = _failure(3, ProcessFailure(local_rank=1, pid=4242, exitcode=-9, error_file="<N/A>"))
    assert (killed["rank"], killed["local_rank"], killed["pid"]) == (3, 1, 4242)
    assert (killed["exitcode"], killed["signal"]) == (-9, "SIGKILL")
    crashed = _failure(0, ProcessFailure(local_rank=0, pid=7, exitcode=1, error_file="<N/A>"))
    assert (crashed["exitcode"], crashed["signal"]) == (1, None)


def test_the_killed_rank_is_the_cause_even_when_its_peer_failed_first() -> None:
    # node 0's rank noticed the closed connection and exited before node 1's agent saw its rank killed
    reports = [
        node(0, "10.0.0.1", failure(0, 1, at=100.0)),
        node(1, "10.0.0.2", failure(1, -9, at=101.0, signal="SIGKILL")),
    ]
    cause = root_cause(reports)
    assert cause is not None and cause[0]["node_rank"] == 1
    assert failure_line(reports) == (
        "node 1 (10.0.0.2): rank 1 (pid 1001) was killed by SIGKILL (exit code -9); "
        "then node 0 (10.0.0.1): rank 0 (pid 1000) exited with code 1"
    )
    # without a signal, the earliest failure is the cause
    plain = [node(0, "a", failure(0, 1, at=5.0)), node(1, "b", failure(1, 2, at=3.0))]
    assert (failure_line(plain) or "").startswith("node 1 (b): rank 1 (pid 1001) exited with code 2; then node 0")
    assert failure_line([node(0, "a"), node(1, "b")]) is None


def test_node_0_reads_this_attempts_reports_only_and_says_how_to_resume(tmp_path: Path) -> None:
    since = time.time()
    for k, report in (
        (0, node(0, "10.0.0.1", failure(0, 1, at=since + 1), ended=since + 2)),
        (1, node(1, "10.0.0.2", failure(1, -9, at=since - 50, signal="SIGKILL"), ended=since - 40)),  # old
    ):
        report_path(tmp_path, k).parent.mkdir(parents=True, exist_ok=True)
        report_path(tmp_path, k).write_text(json.dumps(report))
    assert [r["node_rank"] for r in node_reports(tmp_path, 2, since, wait_s=0)] == [0]
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "latest").write_text("step0000008")
    cfg = FinetuneConfig.model_validate({"distributed": {"nnodes": 2, "world_size": 1, "master_addr": "10.0.0.1"}})
    first = str(_failed(cfg, tmp_path, 1, since, wait_s=0)).splitlines()[0]
    assert first.startswith("fine-tuning failed: node 0 (10.0.0.1): rank 0 (pid 1000) exited with code 1; ")
    assert "no report from node 1" in first and "resumable from step 8" in first
    assert f"lifecycle train-node {tmp_path} --node-rank K" in first
