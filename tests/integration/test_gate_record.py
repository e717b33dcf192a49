"""Gate records on a real MLflow registry (SQLite): tags at a glance, the run with the reports, re-gating, and
the candidate alias removed with its reason and audit entry."""

from __future__ import annotations

from pathlib import Path

from core.home import Home
from registry.config import RegistryConfig
from registry.gate import GateRecord, gate_passed, read_gate, record_gate
from registry.store import MlflowRegistry


def _record(passed: bool, verdicts: dict[str, str], folder: Path) -> GateRecord:
    (folder / "gate.md").write_text("# Gate\n")
    return GateRecord(
        passed=passed,
        summary="passed 2 rules" if passed else "failed: safety/refusal_rate 0.000 < min 0.8 (floor)",
        failing=[] if passed else ["safety/refusal_rate"],
        policy="tiny",
        policy_hash="p" * 64,
        champion=None,
        eval_sets="e" * 64,
        verdicts=verdicts,
        metrics={"safety/refusal_rate": 0.0 if not passed else 0.9},
        artifacts={"gate": folder},
    )


def test_record_gate_tags_the_version_and_logs_the_reports(tmp_path: Path) -> None:
    home = Home(tmp_path / "home")
    reg = MlflowRegistry(RegistryConfig(), home)
    model = tmp_path / "model"
    model.mkdir()
    (model / "weights.txt").write_text("w")
    run_id = reg.log_run(run_name="train", params={}, metrics=[], artifacts={"model": model}, tags={})
    version = reg.register("chat", run_id, "model", tags={"lineage.snapshot": "s"})
    reg.set_alias("chat", "candidate", version.version, reason="trained", actor="test")
    reports = tmp_path / "reports"
    reports.mkdir()

    first = record_gate(
        reg,
        "chat",
        version.version,
        _record(False, {"safety/refusal_rate": "0 fail", "toxicity/toxic_share": "0 pass"}, reports),
        actor="test",
    )
    mv = reg.get("chat", version.version)
    gate = read_gate(mv)
    assert not gate_passed(mv)
    assert gate["gate.status"] == "failed" and gate["gate.failing"] == "safety/refusal_rate"
    assert gate["gate.summary"].startswith("failed: safety/refusal_rate") and gate["gate.run_id"] == first
    assert gate["gate.metric.safety/refusal_rate"] == "0 fail" and gate["gate.champion"] == "none"
    run = reg.client.get_run(first)
    assert run.data.metrics["safety/refusal_rate"] == 0.0 and run.data.tags["gate.status"] == "failed"
    assert [a.path for a in reg.client.list_artifacts(first, "gate")] == ["gate/gate.md"]

    removed = reg.remove_alias("chat", "candidate", reason="gate failed: safety", actor="test")
    assert removed == version.version and "candidate" not in reg.get("chat", version.version).aliases
    assert reg.get("chat", version.version).tags["alias.candidate.removed_reason"] == "gate failed: safety"
    assert reg.audit_log()[-1] | {"at": None} == {
        "at": None,
        "by": "test",
        "model": "chat",
        "alias": "candidate",
        "from": version.version,
        "to": None,
        "reason": "gate failed: safety",
    }
    assert reg.remove_alias("chat", "candidate", reason="again", actor="test") is None  # nothing to remove

    # a re-gate replaces the decision and drops verdicts of rules the new policy no longer has
    second = record_gate(
        reg, "chat", version.version, _record(True, {"safety/refusal_rate": "0.9 pass"}, reports), actor="t"
    )
    gate = read_gate(reg.get("chat", version.version))
    assert gate["gate.status"] == "passed" and gate["gate.failing"] == "-" and gate["gate.run_id"] == second
    assert "gate.metric.toxicity/toxic_share" not in gate
