"""The scheduled deployments on a Prefect work pool, run by ``prefect worker`` processes (the production mode of
``lifecycle schedule``; the embedded one serves them from its own process, ``flows/schedule.py``).

    export PREFECT_API_URL=http://prefect-server:4200/api          # a Prefect server on PostgreSQL
    lifecycle schedule --config configs/production.yaml --work-pool lifecycle     # registers, then exits
    prefect worker start --pool lifecycle --type process           # as many as you like, wherever the project is
                                                                    # installed and the home folder mounted

Registering puts on the server, replacing what an earlier registration put there (rerun it after a config change:
the deployments carry the resolved config as their parameters):
- the work pool (type ``process``) when it does not exist yet (a worker started first creates it as well);
- the deployments of ``flows/schedule.py``, on the pool, each sending heartbeats while it runs;
- the locks of ``flows/lock.py`` (the rollout controller's and the retrain check's);
- two automations for runs whose worker died without a word (SIGKILL, an OOM kill, a lost machine or container):
  ``crash``: a run of ours silent for ``schedule.crash_after_s`` (no heartbeat, no end) is marked Crashed;
  ``reschedule``: a run ``crash`` marked so is set back to Scheduled, and the next worker that polls the pool runs
  it. An attempt past ``1 + schedule.crash_retries`` fails at its start instead of running (``attempt_guard`` of
  ``flows/lock.py``), so a run that keeps losing its worker ends Failed, saying so.

Why ``reschedule`` reacts to ``crash``'s own "action executed" event rather than to the run's Crashed state: the
trigger service handles a state-change event only after the event it follows, and the runs Prefect's scheduler
creates have no event for their first (Scheduled) state, so each later state event of a scheduled run waits out
the service's 15-minute look-back before an automation sees it. The heartbeats (which start ``crash``'s watch) and
the automation's events follow nothing unseen and are handled at once. The same delay is why ``crash`` also fires
for runs that ended normally (their end event reaches the trigger late): Prefect refuses to move a finished run
to Crashed, the action fails, and ``reschedule`` (which needs it executed) does nothing.

Nothing runs twice at once: each deployment allows one run at a time (a run due while one runs is cancelled, a
rescheduled one included when a newer run took the slot first: the newer one does its work);
the controller and the retrain check also hold their lock (``flows/lock.py``), which, unlike the deployment's
slot, stays held while a run Prefect marked Crashed is in fact still alive; and a controller tick reads the
rollout's state afresh from the registry, so a rescheduled tick redoes nothing a finished one did.

Not covered: a worker that dies after taking a run and before the run's process started (state Pending) leaves
the run Pending; Prefect sends no heartbeat before Running (``prefect flow-run cancel`` or a rerun clears it). Nor
does one killed before the run's first heartbeat reached the server (``crash`` watches from the first heartbeat).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from prefect import get_client
from prefect.automations import Automation
from prefect.client.schemas.actions import WorkPoolCreate
from prefect.client.schemas.objects import StateType
from prefect.events.actions import ChangeFlowRunState
from prefect.events.schemas.automations import EventTrigger, Posture
from prefect.exceptions import ObjectNotFound
from prefect.workers.process import ProcessWorker

from core.errors import ConfigError
from core.home import Home
from flows.config import LifecycleConfig
from flows.lock import ensure_lock, lock_name
from flows.schedule import TAG, deployments, describe
from flows.stages import open_registry

Say = Callable[[str], None]
ENDED = {f"prefect.flow-run.{s}" for s in ("Completed", "Failed", "Cancelled", "Crashed")}
CRASH = f"{TAG}: crash runs whose worker died"
RESCHEDULE = f"{TAG}: reschedule crashed runs"


@dataclass
class Registration:
    api: str
    pool: str
    deployments: dict[str, str] = field(default_factory=dict)  # name -> id
    automations: list[str] = field(default_factory=list)
    locks: list[str] = field(default_factory=list)


def _ours() -> dict[str, str]:
    """Events whose run carries our tag (a shared Prefect server runs other teams' flows too)."""
    return {"prefect.resource.role": "tag", "prefect.resource.id": f"prefect.tag.{TAG}"}


def crash_automation(cfg: LifecycleConfig) -> Automation:
    """After a heartbeat, expect another heartbeat or the run's end within ``crash_after_s``; else: Crashed."""
    s = cfg.schedule
    return Automation(
        name=CRASH,
        description=f"A run that sent no heartbeat (every {s.heartbeat_s} s) for {s.crash_after_s} s has lost its "
        "worker: marked Crashed (then rescheduled by the next automation).",
        trigger=EventTrigger(
            after={"prefect.flow-run.heartbeat"},
            expect={"prefect.flow-run.heartbeat", *ENDED},
            match={"prefect.resource.id": "prefect.flow-run.*"},
            match_related=_ours(),
            for_each={"prefect.resource.id"},
            posture=Posture.Proactive,
            threshold=1,
            within=timedelta(seconds=s.crash_after_s),
        ),
        actions=[
            ChangeFlowRunState(
                state=StateType.CRASHED,
                message=f"no heartbeat for {s.crash_after_s} s: the worker running it died",
            )
        ],
    )


def reschedule_automation(cfg: LifecycleConfig) -> Automation:
    """Once ``crash`` has marked a run Crashed, that run goes back to Scheduled (any worker takes it)."""
    return Automation(
        name=RESCHEDULE,
        description=f"A run the automation {CRASH!r} marked Crashed is scheduled again; the next worker that polls "
        f"the pool runs it (attempts past {1 + cfg.schedule.crash_retries} fail at their start).",
        trigger=EventTrigger(
            expect={"prefect.automation.action.executed"},  # only when the Crashed state was accepted
            match={"prefect.resource.id": "prefect.automation.*", "prefect.resource.name": CRASH},
            posture=Posture.Reactive,
            threshold=1,
            within=timedelta(0),
        ),
        # the event names the crashed run as its "target": the action acts on that run
        actions=[
            ChangeFlowRunState(
                state=StateType.SCHEDULED,
                name="Rescheduled",
                message="crashed with its worker: rescheduled for the next worker",
            )
        ],
    )


def _replace_automation(automation: Automation, name: str) -> None:
    with get_client(sync_client=True) as client:
        for old in client.read_automations_by_name(name=name):
            client.delete_automation(old.id)
    automation.create()


def _ensure_pool(pool: str) -> None:
    with get_client(sync_client=True) as client:
        try:
            existing = client.read_work_pool(pool)
        except ObjectNotFound:
            template: dict[str, Any] = ProcessWorker.get_default_base_job_template()
            client.create_work_pool(WorkPoolCreate(name=pool, type="process", base_job_template=template))
            return
    if existing.type != "process":
        raise ConfigError(
            f"work pool {pool!r} is of type {existing.type!r}; the lifecycle's flows run on a 'process' pool "
            "(schedule.work_pool names another pool, or delete this one)"
        )


def register_on_pool(cfg: LifecycleConfig, home: Home, pool: str, say: Say) -> Registration:
    """Put the deployments, locks and crash automations on the server of ``PREFECT_API_URL``, on work pool ``pool``."""
    api = os.environ.get("PREFECT_API_URL")
    if not api:
        raise ConfigError(
            "lifecycle schedule --work-pool needs a Prefect server shared with the workers: set PREFECT_API_URL "
            "(e.g. http://127.0.0.1:4200/api)"
        )
    # the registry's store exists before the first runs start together (a fresh store migrated by several runs at
    # once fails)
    open_registry(cfg, home).experiment_id()
    reg = Registration(api=api, pool=pool)
    _ensure_pool(pool)
    for purpose in ("rollout", "retrain"):
        name = lock_name(purpose, cfg.registry.model_name)
        ensure_lock(name)
        reg.locks.append(name)
    _replace_automation(crash_automation(cfg), CRASH)
    _replace_automation(reschedule_automation(cfg), RESCHEDULE)
    reg.automations = [CRASH, RESCHEDULE]
    for dep in deployments(cfg, home, pool):
        reg.deployments[dep.name] = str(dep.apply(work_pool_name=pool))
    ui = api.removesuffix("/api")
    say(f"registered on work pool {pool!r} of {ui} (deployments: {ui}/deployments)")
    for name, when in describe(cfg):
        say(f"  {name:<20} {when}")
    say(f"workers run them: PREFECT_API_URL={api} prefect worker start --pool {pool} --type process")
    return reg
