"""The retrain decision log: every retrain decision, either way, one JSON line each (``logs/retrain-decisions.jsonl``).

    log = RetrainLog(home.decision_log("retrain"))
    log.append(decision, by="flow-run:...", run_id=monitor_run_id)
    log.last_trigger()          # the history ``decide_retrain`` reads: the last decision that triggered a retrain

A line is ``{"at", "by", "run_id", "decision": RetrainDecision.to_dict()}``: who decided, the MLflow run of the
drift report it judged, and the decision with its evidence. Append-only; the registry's tags carry the latest one
too (the orchestration writes those, ``flows.signals.record_decision``).
"""

from __future__ import annotations

import json
from pathlib import Path

from monitoring.retrain import RetrainDecision, RetrainRecord


class RetrainLog:
    def __init__(self, path: Path) -> None:
        self.path = path

    def append(self, decision: RetrainDecision, *, by: str, run_id: str) -> None:
        entry = {"at": decision.at.isoformat(), "by": by, "run_id": run_id, "decision": decision.to_dict()}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a", encoding="utf-8") as f:
            f.write(json.dumps(entry, default=str) + "\n")

    def last_trigger(self) -> RetrainRecord | None:
        """The record of the last decision that triggered a retrain; None when none did (or no log yet)."""
        last = None
        if self.path.is_file():
            for line in self.path.read_text(encoding="utf-8").splitlines():
                last = RetrainDecision.from_dict(json.loads(line)["decision"]).record() or last
        return last
