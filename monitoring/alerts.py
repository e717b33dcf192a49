"""Alerts that come from batch jobs rather than scrapes: the daily champion eval runs once a day in a Prefect flow,
so instead of a metric for Prometheus to scrape (a pushgateway would be one more service, and a daily sample is
stale for 23 hours of every scrape) it posts its alert straight to Alertmanager's ``/api/v2/alerts``, where it
takes the same route as Prometheus' alerts: to the champion watch, which records it on the champion. The drift
check (``lifecycle monitor``, every 15 minutes, and the retrain check) posts DriftDetected the same way.

    drops = eval_drops(previous, current, directions, max_drop=0.05)     # pure
    if drops: post_alert(url, eval_drop_alert(ref, drops, max_drop))     # side effect
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx

log = logging.getLogger("lifecycle.alerts")

EVAL_DROP = "ChampionEvalDrop"
DRIFT = "DriftDetected"


def eval_drops(
    previous: Mapping[str, float], current: Mapping[str, float], higher_is_better: Mapping[str, bool], max_drop: float
) -> dict[str, float]:
    """Metrics whose value got worse by more than ``max_drop`` (relative to the previous value), with the drop.
    Metrics without a direction, without a previous value or at 0 before are skipped."""
    out = {}
    for name, now in current.items():
        before, up = previous.get(name), higher_is_better.get(name)
        if before is None or up is None or before == 0:
            continue
        drop = (before - now) / abs(before) if up else (now - before) / abs(before)
        if drop > max_drop:
            out[name] = round(drop, 4)
    return out


def eval_drop_alert(
    model_version: str, drops: Mapping[str, float], max_drop: float, hours: float = 24
) -> dict[str, Any]:
    """One Alertmanager alert (API v2) for a daily eval drop; it ends by itself after ``hours`` unless re-posted."""
    worst = ", ".join(f"{k} -{v:.1%}" for k, v in sorted(drops.items(), key=lambda kv: -kv[1]))
    summary = f"{model_version}: daily eval dropped over {max_drop:.0%} ({worst})"
    return _alert(EVAL_DROP, "quality", model_version, summary, hours)


def drift_alert(model_version: str, reason: str, hours: float = 1) -> dict[str, Any]:
    """One Alertmanager alert for prompt drift on the champion's traffic (a warning for a person: the retrain
    policy, not the watch, decides what drift does); it ends by itself after ``hours`` unless the next check
    re-posts it."""
    return _alert(DRIFT, "drift", model_version, f"{model_version}: prompts drifted ({reason[:300]})", hours)


def _alert(name: str, signal: str, model_version: str, summary: str, hours: float) -> dict[str, Any]:
    now = datetime.now(UTC)
    return {
        "labels": {"alertname": name, "severity": "warning", "signal": signal, "model_version": model_version},
        "annotations": {"summary": summary},
        "startsAt": now.isoformat(),
        "endsAt": (now + timedelta(hours=hours)).isoformat(),
    }


def post_alert(alertmanager_url: str, alert: Mapping[str, Any], timeout_s: float = 10) -> bool:
    """POST one alert to Alertmanager; False (and a warning logged) when it does not take it: the batch job that
    raised it goes on, its own record (tags, report) stands."""
    try:
        url = alertmanager_url.rstrip("/") + "/api/v2/alerts"
        httpx.post(url, json=[alert], timeout=timeout_s).raise_for_status()
    except httpx.HTTPError as exc:
        log.warning("could not post %s to %s: %s", alert["labels"]["alertname"], alertmanager_url, exc)
        return False
    return True
