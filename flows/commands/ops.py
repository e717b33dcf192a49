"""Operating commands: ``schedule`` (the loop on schedules) and ``ui`` (the MLflow and Prefect UIs)."""

from __future__ import annotations

import contextlib
import sys
import time

from core.errors import LifecycleError
from core.process import ServerProcess
from flows.commands.base import Context, command, say, stop_on_term


@command(
    "schedule",
    help="run the loop on schedules until Ctrl-C: a local Prefect server (unless PREFECT_API_URL is set) serving "
    "the rollout controller (every minute), monitoring (15 min), the champion's eval (daily) and the retrain "
    "check (nightly)",
    example="lifecycle schedule\n  lifecycle schedule --set schedule.monitor_every_s=300\n"
    "  PREFECT_API_URL=http://prefect:4200/api lifecycle schedule",
)
def schedule(ctx: Context) -> int:
    from flows.schedule import serve_schedules

    stop_on_term()
    with contextlib.suppress(KeyboardInterrupt):
        serve_schedules(ctx.config, ctx.home, say)
    print("schedules stopped", file=sys.stderr)
    return 0


@command(
    "ui",
    help="start the MLflow UI (the registry: set alias 'challenger' to promote) and the Prefect UI, print their "
    "URLs, stop both on Ctrl-C",
    example="lifecycle ui\n  lifecycle ui --set schedule.mlflow_port=5001 --set schedule.prefect_port=4201",
)
def ui(ctx: Context) -> int:
    from flows.schedule import open_uis

    def wait(servers: list[ServerProcess]) -> None:
        while all(s.alive() for s in servers):
            time.sleep(0.5)
        raise LifecycleError("a UI server exited; see its log above")

    stop_on_term()
    with contextlib.suppress(KeyboardInterrupt):
        open_uis(ctx.config, ctx.home, say, wait)
    print("UIs stopped", file=sys.stderr)
    return 0
