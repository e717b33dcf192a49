"""One run at a time where two would do harm: the lock the rollout controller and the retrain check hold while
they decide and act.

    with held_lock(f"lifecycle-rollout-{model}", lease_s=cfg.schedule.lock_lease_s):
        controller.tick()

Why a lock besides the deployments' own concurrency limit (1 run, new ones cancelled): Prefect frees a deployment's
slot the moment its server marks a run Crashed, and a run can be marked so while its process still runs (a worker
cut off from the API stops sending heartbeats; the zombie automation of ``flows/workpool.py`` then reschedules it).
This lock is a Prefect global concurrency limit of one slot that the running process itself holds under a lease
it renews every three quarters of ``lease_s``: it stays held as long as its holder lives, whatever state the
server shows for the run, and frees itself ``lease_s`` after the holder died. A holder that cannot renew (cut off
from the API) stops itself rather than run on unguarded. A run that finds the lock held waits for it.

The limit is created on first use, so the lock works the same on the embedded server of ``lifecycle schedule``, on
``lifecycle rollout tick``'s temporary one and on a shared production server.

``attempt_guard`` is the other half of a run's safety on a work pool: a run whose worker died is rescheduled
(``flows/workpool.py``), and an attempt past ``1 + schedule.crash_retries`` fails at its start, saying why, rather
than take down one worker after another.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from prefect import get_client, get_run_logger
from prefect.concurrency.sync import concurrency
from prefect.runtime import flow_run

from core.errors import LifecycleError


def lock_name(purpose: str, model: str) -> str:
    """The lock of one purpose (``rollout``, ``retrain``) for one registered model: two models on one Prefect
    server do not wait on each other."""
    return f"lifecycle-{purpose}-{model}"


def ensure_lock(name: str) -> None:
    """The one-slot global concurrency limit ``name`` (created if missing; its limit set back to 1 if changed)."""
    with get_client(sync_client=True) as client:
        client.upsert_global_concurrency_limit_by_name(name, limit=1)


@contextmanager
def held_lock(name: str, *, lease_s: float) -> Iterator[None]:
    """Hold the lock ``name`` for the body of a flow run (waiting for it while another run holds it)."""
    logger = get_run_logger()
    ensure_lock(name)
    logger.info("waiting for lock %s", name)
    # strict: a missing limit is an error, not a silently skipped lock; a failed renewal stops the holder
    with concurrency(name, occupy=1, lease_duration=lease_s, strict=True, raise_on_lease_renewal_failure=True):
        logger.info("holding lock %s", name)
        yield


def attempt_guard(crash_retries: int) -> None:
    """Refuse to run attempt ``1 + crash_retries + 1`` of this flow run (each crash of its worker reschedules it)."""
    attempt = flow_run.get_run_count()
    if attempt > 1 + crash_retries:
        raise LifecycleError(
            f"flow run {flow_run.get_name()} crashed with its worker {attempt - 1} times "
            f"(schedule.crash_retries: {crash_retries}): not run again; the next scheduled run takes over"
        )
