"""Operating commands: ``schedule`` (the loop on schedules) and ``ui`` (the MLflow and Prefect UIs)."""

from __future__ import annotations

import contextlib
import sys
import time
from dataclasses import asdict

from core.errors import LifecycleError
from core.process import ServerProcess
from flows.commands.base import Arg, Context, command, say, stop_on_term


@command(
    "schedule",
    help="run the loop on schedules: the rollout controller (every minute), monitoring (15 min), the champion's "
    "eval (daily) and the retrain check (nightly). Embedded: a local Prefect server (unless PREFECT_API_URL is "
    "set) serves them until Ctrl-C. With --work-pool: registers them on that work pool of PREFECT_API_URL's server "
    "and exits; prefect worker processes run them",
    example="lifecycle schedule\n  lifecycle schedule --set schedule.monitor_every_s=300\n"
    "  PREFECT_API_URL=http://prefect:4200/api lifecycle schedule --work-pool lifecycle\n"
    "  PREFECT_API_URL=http://prefect:4200/api prefect worker start --pool lifecycle --type process",
    args=[
        Arg(
            "--work-pool",
            metavar="NAME",
            help="register the deployments on this Prefect work pool and exit (default: schedule.work_pool)",
        )
    ],
)
def schedule(ctx: Context) -> int:
    pool = ctx.args.work_pool or ctx.config.schedule.work_pool
    if pool:
        from flows.workpool import register_on_pool

        reg = register_on_pool(ctx.config, ctx.home, pool, say)
        ctx.emit(asdict(reg), [f"{name}: {id_}" for name, id_ in reg.deployments.items()])
        return 0

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
