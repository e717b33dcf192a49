"""The retrain decision log: every decision appended with who made it, and the last *trigger* read back as the
history the next decision needs (a later no-retrain decision does not erase it)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

from monitoring.retrain import RetrainDecision, RetrainRecord
from monitoring.retrain_log import RetrainLog

T0 = datetime(2025, 3, 1, 12, tzinfo=UTC)


def trigger(at: datetime, champion: str) -> RetrainDecision:
    return RetrainDecision(
        retrain=True,
        at=at,
        reasons=["drift", "refusal rate up"],
        window_start=at - timedelta(hours=1),
        window_end=at,
        champion_version=champion,
    )


def test_no_log_means_no_last_trigger(tmp_path: Path) -> None:
    assert RetrainLog(tmp_path / "logs" / "retrain-decisions.jsonl").last_trigger() is None


def test_the_last_trigger_survives_later_refusals(tmp_path: Path) -> None:
    log = RetrainLog(tmp_path / "logs" / "retrain-decisions.jsonl")
    log.append(trigger(T0, "chat/1"), by="cli:a", run_id="r1")
    log.append(trigger(T0 + timedelta(days=1), "chat/2"), by="flow-run:x", run_id="r2")
    log.append(RetrainDecision(retrain=False, at=T0 + timedelta(days=2), why_not=["cooldown"]), by="cli:a", run_id="r3")

    last = log.last_trigger()
    assert last == RetrainRecord(
        at=T0 + timedelta(days=1),
        window_start=T0 + timedelta(days=1, hours=-1),
        window_end=T0 + timedelta(days=1),
        champion_version="chat/2",
    )
    lines = [json.loads(line) for line in log.path.read_text(encoding="utf-8").splitlines()]
    assert [(e["by"], e["run_id"], e["decision"]["retrain"]) for e in lines] == [
        ("cli:a", "r1", True),
        ("flow-run:x", "r2", True),
        ("cli:a", "r3", False),
    ]
    assert lines[2]["at"] == (T0 + timedelta(days=2)).isoformat()
    assert RetrainDecision.from_dict(lines[0]["decision"]) == trigger(T0, "chat/1")
