"""Schedules and UIs: ``lifecycle schedule`` keeps the loop running, ``lifecycle ui`` opens it to people.

    lifecycle schedule                        # a local Prefect server + the deployments below, until Ctrl-C
    lifecycle schedule --work-pool lifecycle  # register them on a work pool of PREFECT_API_URL's server, and exit
    lifecycle ui                              # the MLflow UI (registry: promote by alias) and the Prefect UI

The deployments (``schedule:`` in the config sets the intervals):

    rollout-controller   every minute      one analysis of the running rollout (``lifecycle rollout tick``)
    safety-classifier-canary  every 5 min  promote, roll back or hold the classifier's canary (``... canary``)
    monitor              every 15 minutes  drift report on the request log (``lifecycle monitor``)
    champion-eval        daily             the champion through the eval suites again
    retrain-check        nightly           drift + quality signals -> maybe a retrain (``lifecycle retrain``)
    log-retention        daily             erase log texts older than serving.log_text_retention_days

Embedded (the default): Prefect refuses to schedule on its ephemeral server, so ``schedule`` starts a real one
(SQLite under ``$LIFECYCLE_HOME/prefect``) unless ``PREFECT_API_URL`` already names one, and the flows run in
subprocesses of this process (``prefect.serve``). On a work pool (``schedule.work_pool``, production):
``flows/workpool.py`` registers the same deployments on the pool and ``prefect worker`` processes run them. Either
way each run gets the resolved config and the home folder as parameters, so what runs at 2 a.m. is what was
scheduled, not whatever the config file says by then.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

from prefect import serve
from prefect.client.schemas.objects import ConcurrencyLimitConfig, ConcurrencyLimitStrategy
from prefect.schedules import Cron, Interval
from prefect.settings import PREFECT_API_URL, temporary_settings
from prefect.types.entrypoint import EntrypointType

from core.home import Home
from core.process import ServerProcess, free_port
from core.runtime import runtime_environment
from flows.config import LifecycleConfig
from flows.evaluate import champion_eval_flow
from flows.monitor import monitor_flow
from flows.retention import log_retention_flow
from flows.retrain import retrain_check_flow
from flows.rollout import rollout_controller_flow
from flows.safety_classifier import safety_classifier_canary_flow
from flows.stages import open_registry
from registry.store import local_tracking_uri

Say = Callable[[str], None]


def _exe(name: str) -> str:
    return str(Path(sys.executable).with_name(name))


def prefect_server(cfg: LifecycleConfig, home: Home) -> tuple[ServerProcess, str]:
    """``prefect server start`` on the home's Prefect database (scheduler and the other services on); its URL."""
    s = cfg.schedule
    url = f"http://{s.host}:{s.prefect_port or free_port(s.host)}"
    env = {
        **os.environ,
        **runtime_environment(home),
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_API_BLOCKS_REGISTER_ON_START": "true",  # the UI's block catalogue (runs' own servers skip it)
    }
    env.pop("PREFECT_API_URL", None)
    cmd = [_exe("prefect"), "server", "start", "--host", s.host, "--port", url.rsplit(":", 1)[1]]
    log = home.logs / "prefect-server.log"
    return ServerProcess("the Prefect server", cmd, log_path=log, health_url=f"{url}/api/health", env=env), url


def mlflow_ui(cfg: LifecycleConfig, home: Home) -> tuple[ServerProcess, str]:
    """``mlflow server`` on the home's MLflow store (the registry UI where reviewers set aliases); its URL."""
    s = cfg.schedule
    url = f"http://{s.host}:{s.mlflow_port or free_port(s.host)}"
    cmd = [_exe("mlflow"), "server", "--host", s.host, "--port", url.rsplit(":", 1)[1], "--workers", "1"]
    cmd += ["--backend-store-uri", local_tracking_uri(home)]
    cmd += ["--artifacts-destination", str(home.mlflow / "artifacts")]
    env = {**os.environ, **runtime_environment(home), "MLFLOW_DISABLE_TELEMETRY": "true"}
    log = home.logs / "mlflow-ui.log"
    return ServerProcess("the MLflow UI", cmd, log_path=log, health_url=f"{url}/health", env=env), url


@contextmanager
def prefect_api(cfg: LifecycleConfig, home: Home, say: Say) -> Iterator[str]:
    """The Prefect API to schedule on: ``PREFECT_API_URL`` when set, else a local server started here."""
    given = os.environ.get("PREFECT_API_URL")
    if given:
        say(f"Prefect server: {given} (PREFECT_API_URL)")
        yield given
        return
    server, url = prefect_server(cfg, home)
    say(f"starting a Prefect server (log: {server.log_path}) ...")
    server.start()
    try:
        server.wait_ready(cfg.schedule.startup_timeout_s)
        api = url + "/api"
        os.environ["PREFECT_API_URL"] = api  # the flow-run subprocesses report to it too
        with temporary_settings(updates={PREFECT_API_URL: api}):
            yield api
    finally:
        os.environ.pop("PREFECT_API_URL", None)
        server.stop()


TAG = "chat-lifecycle"  # on every deployment and its runs; the crash automations (flows/workpool.py) match it


def deployments(cfg: LifecycleConfig, home: Home, pool: str | None = None) -> list[Any]:  # RunnerDeployment
    """The scheduled deployments, each with the resolved config and the home as parameters; with ``pool``,
    deployments of that work pool (its workers import the flows by module path and send heartbeats)."""
    s = cfg.schedule
    common: dict[str, Any] = {
        "parameters": {"cfg": cfg.model_dump(mode="json"), "home": {"root": str(home.root)}},
        "tags": [TAG],
        # the flows validate their parameters themselves (pydantic, on every run); Prefect's server-side JSON-schema
        # check rejects a config field named like a schema keyword (serving.api_keys.required)
        "enforce_parameter_schema": False,
        # one run of each at a time; a run due while the last one still runs is cancelled, not queued (the next
        # interval comes anyway). The controller and the retrain check also hold a lock of their own (flows/lock.py)
        "concurrency_limit": ConcurrencyLimitConfig(limit=1, collision_strategy=ConcurrencyLimitStrategy.CANCEL_NEW),
    }
    if pool is not None:
        common |= {
            "work_pool_name": pool,
            # the package is installed where the workers run (the image, or the project's venv): no code to pull
            "entrypoint_type": EntrypointType.MODULE_PATH,
            # heartbeats are what tells Prefect a run's worker died (the zombie automation of flows/workpool.py)
            # and the switches a lifecycle command sets (offline, caches under the home): workers start plain
            "job_variables": {
                "env": {**runtime_environment(home), "PREFECT_FLOWS_HEARTBEAT_FREQUENCY": str(s.heartbeat_s)}
            },
        }
    return [
        rollout_controller_flow.to_deployment(
            "rollout-controller",
            schedule=Interval(timedelta(seconds=s.rollout_controller_every_s)),
            description="One analysis of the running rollout: advance, hold, promote or roll back.",
            **common,
        ),
        safety_classifier_canary_flow.to_deployment(
            "safety-classifier-canary",
            schedule=Interval(timedelta(seconds=s.classifier_canary_every_s)),
            description="One decision on the safety classifier's canary: promote, roll back or hold.",
            **common,
        ),
        monitor_flow.to_deployment(
            "monitor",
            schedule=Interval(timedelta(seconds=s.monitor_every_s)),
            description="Drift of the request log against the champion's training prompts.",
            **common,
        ),
        champion_eval_flow.to_deployment(
            "champion-eval",
            schedule=Cron(s.champion_eval_cron, timezone=s.timezone),
            description="The champion through the eval suites again; a regression is tagged, not acted on.",
            **common,
        ),
        retrain_check_flow.to_deployment(
            "retrain-check",
            schedule=Cron(s.retrain_check_cron, timezone=s.timezone),
            description="Drift and quality signals decide a retrain (cooldown and loop guard apply).",
            **common,
        ),
        log_retention_flow.to_deployment(
            "log-retention",
            schedule=Cron(s.log_retention_cron, timezone=s.timezone),
            description="Erase the request log's and shadow log's texts older than the retention period.",
            **common,
        ),
    ]


def describe(cfg: LifecycleConfig) -> list[tuple[str, str]]:
    s = cfg.schedule
    return [
        ("rollout-controller", f"every {s.rollout_controller_every_s} s"),
        ("safety-classifier-canary", f"every {s.classifier_canary_every_s} s"),
        ("monitor", f"every {s.monitor_every_s} s"),
        ("champion-eval", f"cron {s.champion_eval_cron!r} ({s.timezone})"),
        ("retrain-check", f"cron {s.retrain_check_cron!r} ({s.timezone})"),
        ("log-retention", f"cron {s.log_retention_cron!r} ({s.timezone})"),
    ]


def serve_schedules(cfg: LifecycleConfig, home: Home, say: Say) -> None:
    """Start (or reach) the Prefect server and serve the deployments until Ctrl-C; everything stops with it."""
    # the registry's store exists before the first runs start together (a fresh SQLite store migrated by several
    # flow runs at once fails: "duplicate column name")
    open_registry(cfg, home).experiment_id()
    with prefect_api(cfg, home, say) as api:
        deps = deployments(cfg, home)
        ui = api.removesuffix("/api")
        say(f"Prefect UI: {ui}  (deployments: {ui}/deployments)")
        for name, when in describe(cfg):
            say(f"  {name:<20} {when}")
        say("Ctrl-C stops the schedules and the server")
        serve(*deps, print_starting_message=False)


def open_uis(cfg: LifecycleConfig, home: Home, say: Say, wait: Callable[[list[ServerProcess]], None]) -> None:
    """The MLflow UI (unless the registry is a remote server: its URL is printed) and the Prefect UI, until
    ``wait`` returns (Ctrl-C); both are stopped in every case."""
    started: list[tuple[str, ServerProcess, str]] = []
    try:
        if cfg.registry.tracking_uri and cfg.registry.tracking_uri.startswith("http"):
            say(f"MLflow UI: {cfg.registry.tracking_uri} (registry.tracking_uri)")
        else:
            server, url = mlflow_ui(cfg, home)
            say(f"starting the MLflow UI on the home's store (log: {server.log_path}) ...")
            started.append(("MLflow UI", server.start(), url))
        if os.environ.get("PREFECT_API_URL"):
            say(f"Prefect UI: {os.environ['PREFECT_API_URL'].removesuffix('/api')} (PREFECT_API_URL)")
        else:
            server, url = prefect_server(cfg, home)
            say(f"starting the Prefect UI (log: {server.log_path}) ...")
            started.append(("Prefect UI", server.start(), url))
        for _, server, _ in started:
            server.wait_ready(cfg.schedule.startup_timeout_s)
        for kind, _, url in started:
            say(f"{kind}: {url}")
        say("Ctrl-C stops them")
        wait([server for _, server, _ in started])
    finally:
        for _, server, _ in started:
            server.stop()
