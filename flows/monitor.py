"""The ``monitor`` flow (scheduled every 15 minutes: a drift report on the request log; ``lifecycle monitor``) and
``lifecycle run``'s drift check (the report of the run's traffic window and the retrain decision).

    lifecycle monitor                  # the last monitoring.drift.window_hours of traffic vs the champion's data

The work is ``flows.signals``'s; these publish the report as a Prefect Markdown artifact (``drift-report``).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact
from prefect.runtime import flow_run

from core.home import Home
from flows.config import LifecycleConfig
from flows.lock import attempt_guard
from flows.signals import monitor_stage, retrain_check_stage
from flows.summaries import MonitorResult


def drift_markdown(check: MonitorResult) -> str:
    r = check.report
    lines = [
        f"# Drift: {r.status}",
        "",
        f"{r.reason}",
        "",
        f"champion {check.champion}, reference snapshot `{check.snapshot[:12]}`: {r.reference_n} prompts; "
        f"window: {r.current_n} prompts; {r.seconds.total_s:.1f} s",
        "",
        "| metric | value |",
        "|---|---|",
    ]
    lines += [f"| {k} | {v:.4g} |" for k, v in sorted(r.metrics().items())]
    return "\n".join(lines) + f"\n\nHTML report: `{check.folder / 'drift.html'}` (MLflow run `{check.run_id}`)\n"


def publish_drift(result: MonitorResult) -> None:
    create_markdown_artifact(
        key="drift-report", markdown=drift_markdown(result), description=result.report.reason[:200]
    )


@flow(name="monitor")
def monitor_flow(cfg: LifecycleConfig, home: Home) -> dict[str, Any]:
    """Scheduled every 15 minutes: the drift report of the last window (Markdown artifact ``drift-report``)."""
    attempt_guard(cfg.schedule.crash_retries)
    result = monitor_stage(cfg, home)
    get_run_logger().info("drift %s: %s", result.report.status, result.report.reason)
    publish_drift(result)
    return result.to_json()


@task(name="drift-check")
def drift_check_task(cfg: LifecycleConfig, home: Home, start: datetime, end: datetime) -> dict[str, Any]:
    """The drift report of the run's traffic window and the retrain decision (recorded either way)."""
    logger = get_run_logger()
    check = retrain_check_stage(cfg, home, actor=f"flow-run:{flow_run.get_id()}", start=start, end=end)
    logger.info("drift %s: %s", check.monitor.report.status, check.monitor.report.reason)
    (logger.warning if check.decision.retrain else logger.info)("%s", check.decision.summary)
    publish_drift(check.monitor)
    return check.to_json()
