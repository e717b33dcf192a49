"""The typed results the flows return and the CLI prints: one place, light to import (no Prefect, MLflow or torch).

    TrainSummary     train flow: snapshot, base model, fine-tune, registered version, timings
    GateSummary      evaluate flow: the gate decision recorded on a version
    RolloutSummary   a rollout under simulated users (lifecycle run, a retrain's ending)
    RetrainSummary   retrain flow: the curated snapshot, then train, gate and (maybe) rollout
    RunSummary       lifecycle-run: the whole loop (its report card: flows/report_card.py)
    RunEnvironment   the machine and package versions a run ran on
    MonitorResult    a drift report of the request log against the champion's training prompts
    RolloutStatus    lifecycle rollout status: aliases, weights, the running rollout, the window, last decisions

They are plain dataclasses, so ``dataclasses.asdict`` is each command's ``--json`` output.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from evals.gate import MetricVerdict
from monitoring.drift import DriftReport

if TYPE_CHECKING:  # monitoring.controller imports the MLflow registry: a type here, not an import at start-up
    from monitoring.controller import Decision

# How a triggered retrain ends once its version passed the gate: a rollout under simulated users (lifecycle run),
# or the challenger alias, which the rollout controller takes on real users (the scheduled retrain check).
RetrainEnding = Literal["simulated-rollout", "challenger"]


@dataclass
class TrainSummary:
    flow_run_id: str
    snapshot: str
    snapshot_counts: dict[str, int]
    base_model: str
    base_model_version: str
    base_model_metrics: dict[str, Any]
    model: str
    version: str
    lineage: dict[str, str]
    metrics: dict[str, Any]
    seconds: dict[str, float] = field(default_factory=dict)
    # with the preference stage: model/version/lineage/metrics are the aligned version's, these its SFT parent's
    sft_parent: str | None = None
    sft_metrics: dict[str, Any] | None = None


@dataclass
class GateSummary:
    flow_run_id: str
    model: str
    version: str
    passed: bool
    summary: str
    failing: list[str]
    champion: str | None
    policy: str
    eval_sets: str
    run_id: str
    metrics: dict[str, float]
    seconds_per_suite: dict[str, float]
    report_dir: str
    # the versions evals.references names, compared on the same items: {tag, ref, rows: [{metric, value,
    # reference_value, improvement, ci_low, ci_high, n_paired, direction}]}
    references: list[dict[str, Any]] = field(default_factory=list)
    verdicts: list[MetricVerdict] = field(default_factory=list)  # one per rule: value, floor, champion, verdict
    stderrs: dict[str, float] = field(default_factory=dict)  # of the metrics that have one
    seconds: float = 0.0  # the whole stage: the version, its champion and its references evaluated, decided


@dataclass
class RolloutSummary:
    model: str
    version: str
    outcome: str  # promoted | rolled-back | rejected | unchanged (already champion) | unfinished
    decisions: list[dict[str, Any]]
    aliases: dict[str, str]
    traffic: dict[str, Any]
    seconds: float
    window: tuple[datetime, datetime] | None = None  # the drift check's traffic window, when one was played


@dataclass
class RetrainSummary:
    snapshot: str
    train: TrainSummary
    gate: GateSummary
    rollout: RolloutSummary | None


@dataclass
class RunEnvironment:
    """Where a run ran: the machine (``core.machine``) and the versions of the packages its numbers depend on."""

    cpu: str  # the CPU's model name
    isa_class: str  # the kernels PyTorch uses: avx2 | avx2 kernels | avx512 | avx512_bf16 | amx_bf16
    cores: int
    python: str
    packages: dict[str, str]  # import name -> installed version ("-": not installed)


@dataclass
class RunSummary:
    train: TrainSummary
    gate: GateSummary
    rollout: RolloutSummary | None = None
    drift: dict[str, Any] | None = None  # the drift report and the retrain decision on the run's traffic
    retrain: RetrainSummary | None = None
    seconds: float = 0.0
    started_at: datetime | None = None  # UTC; names the run's report folder
    environment: RunEnvironment | None = None
    report_card: str | None = None  # reports/run-<time>/report.md under the home, once written
    quantized: GateSummary | None = None  # quantize.enabled: the quantized variant's gate against the version
    quantize_seconds: float = 0.0  # quantize.enabled: the quantize stage (the variant made and registered)


@dataclass(frozen=True)
class MonitorResult:
    report: DriftReport
    champion: str  # e.g. chat/3
    snapshot: str  # the reference: the champion's training snapshot
    folder: Path  # reports/drift/<time>/ with drift.html and drift.json
    run_id: str

    def to_json(self) -> dict[str, Any]:
        r = self.report
        return {
            "status": r.status,
            "drifted": r.drifted,
            "reason": r.reason,
            "champion": self.champion,
            "snapshot": self.snapshot,
            "reference_n": r.reference_n,
            "current_n": r.current_n,
            "metrics": r.metrics(),
            "seconds": r.seconds.total_s,
            "html": str(self.folder / "drift.html"),
            "run_id": self.run_id,
        }


@dataclass
class RolloutStatus:
    model: str
    aliases: dict[str, str]
    canary_weight: int
    accepted_champion: str | None
    state: dict[str, Any] | None
    window: dict[str, dict[str, Any]]  # version ref -> stats over the current analysis window
    decisions: list[Decision]


def stat_cell(value: Any) -> str:
    """One cell of the status window: rates to 3 decimals, milliseconds and counts whole, '-' for none."""
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3f}" if value <= 1 else f"{value:.0f}"
    return str(value)
