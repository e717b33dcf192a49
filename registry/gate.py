"""Gate records on model versions: the decision as ``gate.*`` tags (readable at a glance in the MLflow UI) and an
MLflow run holding the eval metrics and the JSON/Markdown reports as artifacts.

    record_gate(reg, "chat", "3", GateRecord(passed=False, failing=["safety/refusal_rate"], ...))
    read_gate(reg.get("chat", "3"))   # -> the tags back, for promotion checks

Tags on the version:
    gate.status        passed | failed
    gate.failing       comma-separated failing metrics, or "-"
    gate.summary       one line: why it passed or failed
    gate.policy        policy name and hash;  gate.champion  the version compared against, or "none"
    gate.eval_sets     hash of the eval sets (which items);  gate.run_id  the MLflow run with the reports
    gate.at            when;  gate.metric.<suite>/<metric>  "<value> pass|fail" for every gated metric
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from registry.store import MlflowRegistry, ModelVersion

_MAX_TAG = 5000


@dataclass(frozen=True)
class GateRecord:
    passed: bool
    summary: str
    failing: list[str]
    policy: str
    policy_hash: str
    champion: str | None
    eval_sets: str
    verdicts: dict[str, str]  # metric -> "0.972 pass"
    metrics: dict[str, float]  # every metric of the eval report, logged on the run
    params: dict[str, str] = field(default_factory=dict)
    artifacts: dict[str, Path] = field(default_factory=dict)  # artifact folder -> local file


def record_gate(reg: MlflowRegistry, name: str, version: str, record: GateRecord, *, actor: str) -> str:
    """Log the eval run, tag the version with the decision; returns the run id."""
    now = datetime.now(UTC).isoformat(timespec="seconds")
    status = "passed" if record.passed else "failed"
    run_id = reg.log_run(
        run_name=f"gate {name}/{version}",
        params={
            "model": f"{name}/{version}",
            "policy": record.policy,
            "champion": record.champion or "none",
            "eval_sets": record.eval_sets,
            **record.params,
        },
        metrics=[{"step": 0, **record.metrics}],
        artifacts=record.artifacts,
        tags={"lifecycle.kind": "gate", "gate.model": f"{name}/{version}", "gate.status": status},
    )
    tags = {
        "gate.status": status,
        "gate.failing": ",".join(record.failing) or "-",
        "gate.summary": record.summary[:_MAX_TAG],
        "gate.policy": f"{record.policy} ({record.policy_hash[:12]})",
        "gate.champion": record.champion or "none",
        "gate.eval_sets": record.eval_sets,
        "gate.run_id": run_id,
        "gate.at": now,
        "gate.by": actor,
        **{f"gate.metric.{k}": v for k, v in record.verdicts.items()},
    }
    stale = [k for k in reg.get(name, version).tags if k.startswith("gate.metric.") and k not in tags]
    for key in stale:  # a re-gate under a policy with fewer rules must not leave old verdicts behind
        reg.client.delete_model_version_tag(name, version, key)
    reg.set_tags(name, version, tags)
    return run_id


def read_gate(version: ModelVersion) -> dict[str, str]:
    """The ``gate.*`` tags of a version (empty when it was never gated)."""
    return {k: v for k, v in version.tags.items() if k.startswith("gate.")}


def gate_passed(version: ModelVersion) -> bool:
    return version.tags.get("gate.status") == "passed"
