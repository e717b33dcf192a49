"""The work pool's safety nets, as registered on the Prefect server (``flows/workpool.py``, ``flows/lock.py``): which
runs the crash automation watches and when it fires, that the reschedule follows only a crash it made, the
deployments' one-run limit and heartbeats, and the attempt guard. The e2e proof with real workers is
tests/e2e/test_scale_stack.py."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
from prefect.client.schemas.objects import ConcurrencyLimitStrategy, StateType
from prefect.events.actions import ChangeFlowRunState
from prefect.events.schemas.automations import Posture

from core.errors import ConfigError, LifecycleError
from core.home import Home
from flows import lock
from flows.config import CONFIG_DIR, load_config
from flows.schedule import TAG, deployments
from flows.workpool import CRASH, crash_automation, reschedule_automation


def cfg(*overrides: str):  # type: ignore[no-untyped-def]
    return load_config(CONFIG_DIR / "tiny.yaml", list(overrides))


def test_a_run_of_ours_silent_for_crash_after_s_is_marked_crashed() -> None:
    auto = crash_automation(cfg("schedule.crash_after_s=75"))
    trigger = auto.trigger
    assert trigger.posture == Posture.Proactive and trigger.within == timedelta(seconds=75)
    assert trigger.after == {"prefect.flow-run.heartbeat"}
    # another heartbeat or any end keeps it quiet
    assert trigger.expect >= {"prefect.flow-run.heartbeat", "prefect.flow-run.Completed", "prefect.flow-run.Crashed"}
    assert trigger.for_each == {"prefect.resource.id"}  # one watch per run
    ours = {"prefect.resource.role": "tag", "prefect.resource.id": f"prefect.tag.{TAG}"}
    assert trigger.match_related.model_dump() == ours  # other teams' runs on a shared server are left alone
    (action,) = auto.actions
    assert isinstance(action, ChangeFlowRunState) and action.state == StateType.CRASHED and not action.force


def test_the_reschedule_follows_only_a_crash_the_crash_automation_made() -> None:
    auto = reschedule_automation(cfg())
    trigger = auto.trigger
    # executed, not triggered: a run that had ended (Prefect refused the Crashed state) is never rescheduled
    assert trigger.expect == {"prefect.automation.action.executed"}
    assert trigger.match["prefect.resource.name"] == [CRASH] and trigger.posture == Posture.Reactive
    (action,) = auto.actions
    assert isinstance(action, ChangeFlowRunState) and (action.state, action.name) == (
        StateType.SCHEDULED,
        "Rescheduled",
    )


def test_pool_deployments_run_one_at_a_time_and_send_heartbeats(tmp_path: Path) -> None:
    c = cfg("schedule.heartbeat_s=45", "schedule.crash_after_s=120")
    deps = deployments(c, Home(tmp_path), pool="lifecycle")
    assert [d.name for d in deps] == [
        "rollout-controller",
        "safety-classifier-canary",
        "monitor",
        "champion-eval",
        "retrain-check",
        "log-retention",
    ]
    for d in deps:
        assert d.work_pool_name == "lifecycle" and TAG in d.tags
        assert d.concurrency_limit == 1
        assert d.concurrency_options.collision_strategy == ConcurrencyLimitStrategy.CANCEL_NEW
        assert d.job_variables["env"]["PREFECT_FLOWS_HEARTBEAT_FREQUENCY"] == "45"


def test_crash_after_s_must_exceed_the_heartbeat() -> None:
    with pytest.raises(ConfigError, match="must exceed schedule.heartbeat_s"):
        cfg("schedule.heartbeat_s=60", "schedule.crash_after_s=60")


def test_an_attempt_past_the_crash_retries_refuses_to_run(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lock.flow_run, "get_name", lambda: "brave-otter")
    monkeypatch.setattr(lock.flow_run, "get_run_count", lambda: 2)
    lock.attempt_guard(1)  # the one retry runs
    monkeypatch.setattr(lock.flow_run, "get_run_count", lambda: 3)
    with pytest.raises(LifecycleError, match="brave-otter crashed with its worker 2 times"):
        lock.attempt_guard(1)
