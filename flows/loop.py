"""The whole loop as one Prefect flow, ``lifecycle-run``: train, evaluate and gate the fresh version, roll it out
under simulated traffic, check that traffic for drift, and retrain (train -> gate -> rollout again) when the
decision says so.

    lifecycle run
    lifecycle run --traffic-profile drifted      # users that drift: the run retrains

The run writes its own report card, ``reports/run-<time>/report.md`` under the home folder (stage times, the
model against the gate, versions, the machine: ``flows.report_card``). Also Prefect's own record of a run's
timings, for ``benchmarks/run_loop.py``.
"""

from __future__ import annotations

import os
import platform
import time
from datetime import UTC, datetime

from prefect import flow
from prefect.artifacts import create_markdown_artifact
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import (
    FlowFilter,
    FlowFilterName,
    FlowRunFilter,
    FlowRunFilterStartTime,
    TaskRunFilter,
    TaskRunFilterStartTime,
)

from core.home import Home
from core.machine import cpu_model, isa_class
from core.provenance import package_versions
from flows.config import LifecycleConfig
from flows.evaluate import evaluate_flow
from flows.monitor import drift_check_task
from flows.quantization import quantize_stage
from flows.report_card import report_card, report_card_path
from flows.retrain import retrain_flow
from flows.rollout import rollout_markdown, simulated_rollout_task
from flows.summaries import RunEnvironment, RunSummary
from flows.train import train_flow

# the packages whose versions a run's numbers depend on, named in its report card
REPORTED_PACKAGES = ("torch", "vllm", "deepspeed", "mlflow", "prefect")


@flow(name="lifecycle-run")
def lifecycle_run(cfg: LifecycleConfig, home: Home) -> RunSummary:
    """The loop: train, evaluate and gate the fresh version, roll it out under simulated traffic, check that
    traffic for drift, and retrain (train -> gate -> rollout again) when the decision says so; then write the
    run's report card."""
    started, t0 = datetime.now(UTC), time.perf_counter()
    trained = train_flow(cfg, home)
    gated = evaluate_flow(cfg, home, f"{trained.model}/{trained.version}")
    quantized, quantize_s = None, 0.0
    if gated.passed and cfg.quantize.enabled:  # a quantized variant, gated against the version just gated
        q0 = time.perf_counter()
        variant = quantize_stage(cfg, home, f"{trained.model}/{trained.version}", flow_run_id=trained.flow_run_id)
        quantize_s = time.perf_counter() - q0
        quantized = evaluate_flow(cfg, home, variant.ref)
    rolled = drift = retrained = None
    if gated.passed and cfg.run.rollout:
        then = cfg.run.drift_requests if cfg.run.drift_check else 0
        rolled = simulated_rollout_task(cfg, home, trained.model, trained.version, then_requests=then)
        create_markdown_artifact(key="rollout-summary", markdown=rollout_markdown(rolled), description="Rollout")
        if rolled.window is not None:
            drift = drift_check_task(cfg, home, *rolled.window)
            if drift["retrain"] and cfg.run.retrain:
                retrained = retrain_flow(cfg, home, drift["reasons"])
    summary = RunSummary(trained, gated, rolled, drift, retrained, time.perf_counter() - t0, started, run_environment())
    summary.quantized, summary.quantize_seconds = quantized, quantize_s
    path = report_card_path(home, started)
    path.parent.mkdir(parents=True, exist_ok=True)
    markdown = report_card(summary)
    path.write_text(markdown, encoding="utf-8")
    summary.report_card = str(path)
    create_markdown_artifact(key="run-report", markdown=markdown, description=f"lifecycle run: {path}")
    return summary


def run_environment() -> RunEnvironment:
    """This machine (CPU model, the ISA class of the kernels PyTorch uses, cores) and the reported packages."""
    return RunEnvironment(
        cpu=cpu_model(),
        isa_class=isa_class(),
        cores=os.cpu_count() or 0,
        python=platform.python_version(),
        packages=package_versions(REPORTED_PACKAGES),
    )


def flow_run_start(name: str, since: float) -> float | None:
    """When (epoch s) the first run of flow ``name`` after ``since`` started, by Prefect's record: the time before
    it is the API's start (``benchmarks/run_loop.py``)."""
    after = datetime.fromtimestamp(since, UTC)
    with get_client(sync_client=True) as client:
        runs = client.read_flow_runs(
            flow_filter=FlowFilter(name=FlowFilterName(any_=[name])),
            flow_run_filter=FlowRunFilter(start_time=FlowRunFilterStartTime(after_=after)),
            limit=50,
        )
    starts = [r.start_time.timestamp() for r in runs if r.start_time is not None]
    return min(starts) if starts else None


def task_run_seconds(since: float) -> list[tuple[str, float]]:
    """(name, seconds) of the task runs that started after ``since`` (epoch s), by Prefect's own record
    (``total_run_time``: the task bodies); subflow placeholders are left out (their tasks are counted).
    ``benchmarks/run_loop.py`` uses it for the orchestration overhead."""
    after = datetime.fromtimestamp(since, UTC)
    with get_client(sync_client=True) as client:
        runs = client.read_task_runs(
            task_run_filter=TaskRunFilter(start_time=TaskRunFilterStartTime(after_=after)), limit=200
        )
        flows = client.read_flow_runs(limit=200)
    parents = {f.parent_task_run_id for f in flows if f.parent_task_run_id is not None}
    return [(r.name, r.total_run_time.total_seconds()) for r in runs if r.id not in parents]
