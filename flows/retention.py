"""The ``log-retention`` flow (scheduled daily: ``schedule.log_retention_cron``): erase the prompt, reply, error
and feedback texts of request-log and shadow-log rows older than ``serving.log_text_retention_days``; the numeric
rows stay (usage, cost, latency, verdicts). The work is ``ServingStore.erase_old_log_texts``
(``serving.state.retention``); deleting a conversation erases its own texts at once, without waiting for this.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from prefect import flow, get_run_logger

from core.home import Home
from flows.config import LifecycleConfig
from flows.lock import attempt_guard
from flows.stages import open_serving_store


def erase_old_log_texts(cfg: LifecycleConfig, home: Home) -> dict[str, Any]:
    """One retention pass over the serving database ``lifecycle serve`` uses; what it erased."""
    days = cfg.serving.log_text_retention_days
    store = open_serving_store(cfg, home)
    try:
        logged, shadow = store.erase_old_log_texts(timedelta(days=days))
    finally:
        store.close()
    return {"retention_days": days, "request_log_rows": logged, "shadow_log_rows": shadow}


@flow(name="log-retention")
def log_retention_flow(cfg: LifecycleConfig, home: Home) -> dict[str, Any]:
    """Scheduled daily: the log texts older than the retention period are erased (idempotent)."""
    attempt_guard(cfg.schedule.crash_retries)
    result = erase_old_log_texts(cfg, home)
    get_run_logger().info(
        "erased the texts of %d request-log and %d shadow-log rows older than %s days",
        result["request_log_rows"],
        result["shadow_log_rows"],
        result["retention_days"],
    )
    return result
