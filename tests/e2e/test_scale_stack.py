"""The scale path on one machine: the native stack of ``scripts/stack.sh`` (Debian's PostgreSQL and Redis, an
``mlflow server`` on PostgreSQL with proxied artifacts, a Prefect server on PostgreSQL, two ``prefect worker``
processes on the work pool, the gateway) started once for the module on free ports and stopped at its end.

In the order they run:
1. the loop (``lifecycle run``) against the MLflow server, then the registry UI's promotion path: alias
   ``challenger`` set through the server's REST API, as the UI sets it, and a scheduled rollout-controller run on
   a worker acts on it;
2. scheduled controller runs execute on the workers; a worker killed with SIGKILL mid-run (its whole process
   group, as when its machine dies) leaves a run that Prefect marks Crashed (no heartbeat) and reschedules, and
   the other worker runs it; nothing runs twice at once (the deployment's one slot, the controller's lock).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from support.cli_helpers import lifecycle
from support.stack_helpers import NativeStack, Unavailable, wait_for

from core.home import Home
from flows.config import CONFIG_DIR

NORMAL = str(CONFIG_DIR / "scenarios" / "normal.yaml")  # tiny, trained long enough to pass the tiny gate
CONTROLLER = "rollout-controller"
LOCK = "lifecycle-rollout-chat"
CRASH_AFTER_S = 60  # two missed heartbeats (every 30 s, Prefect's minimum), and a margin for a loaded machine
BASE = f"""\
extends: {CONFIG_DIR / "production.yaml"}
schedule:
  rollout_controller_every_s: 10
  crash_after_s: {CRASH_AFTER_S}
"""


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, session_home: Home) -> Iterator[NativeStack]:
    base = tmp_path_factory.mktemp("stack-config") / "base.yaml"
    base.write_text(BASE)
    env = {
        "PREFECT_SERVER_SERVICES_SCHEDULER_LOOP_SECONDS": "5",  # the server's scheduler looks for due runs
        "PREFECT_WORKER_QUERY_SECONDS": "2",  # and the workers for runs to take
    }
    try:
        with NativeStack.start(workers=2, base_config=base, extra_env=env) as s:
            # only the controller is under test here: the monitor (Evidently, embeddings) must not load the machine
            for name in ("monitor", "champion-eval", "retrain-check"):
                s.prefect.set_paused(name, True)
            yield s
    except Unavailable as exc:
        pytest.skip(str(exc))


def ran_on(stack: NativeStack, run: dict[str, Any]) -> list[str]:
    """The workers that started the run's process, from their own logs (both workers may try to take a run: the
    one whose Pending state the server refused logs 'Aborted submission' instead)."""
    line = f"Flow run '{run['name']}' submitted to infrastructure"
    return [w for w in stack.workers if line in (stack.home / "logs" / f"{w}.log").read_text()]


def running_on(stack: NativeStack, run_id: str) -> str:
    """The worker whose process group holds the run's live process (Prefect's ``infrastructure_pid``; right after
    a reschedule it still names the dead attempt's process until the new worker sets it)."""

    def probe() -> str | None:
        pid = str(stack.prefect.run(run_id)["infrastructure_pid"] or "").rsplit(":", 1)[-1]
        try:
            pgid = os.getpgid(int(pid)) if pid else None
        except ProcessLookupError:
            return None
        return next((w for w in stack.workers if stack.pgid(w) == pgid), None)

    return wait_for("the worker running the run", probe, 60)


def mlflow_model(stack: NativeStack, name: str) -> dict[str, Any]:
    r = httpx.get(f"{stack.mlflow}/api/2.0/mlflow/registered-models/get", params={"name": name}, timeout=30)
    r.raise_for_status()
    return dict(r.json()["registered_model"])


def aliases(stack: NativeStack, name: str) -> dict[str, str]:
    return {a["alias"]: a["version"] for a in mlflow_model(stack, name).get("aliases", [])}


@pytest.mark.slow  # the whole loop (~8 min here); the work pool's promises are the next test's
def test_the_loop_runs_on_the_mlflow_server_and_the_ui_promotion_starts_the_rollout_on_a_worker(
    stack: NativeStack, tmp_path: Path
) -> None:
    # the trainer (compose's `trainer`): lifecycle run with the registry on the stack's MLflow server
    stack.prefect.set_paused(CONTROLLER, True)  # no ticks competing with training for the two cores
    home = tmp_path / "trainer"
    result = lifecycle(
        "run",
        "--config",
        NORMAL,
        "--set",
        f"registry.tracking_uri={stack.mlflow}",
        "--set",
        "run.rollout=false",  # the rollout is the workers' job here, started from the registry
        "--set",
        "run.drift_check=false",
        "--json",
        home=home,
        timeout=1200,
        # the trainer's own home (nothing reaches the workers through files), the stack's Prefect server
        env={k: v for k, v in stack.client_env.items() if k != "LIFECYCLE_HOME"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads(result.stdout)
    assert (summary["train"]["version"], summary["gate"]["passed"]) == ("1", True)
    # the registry lives in the server's PostgreSQL database, its artifacts in the folder the server proxies
    import psycopg

    with psycopg.connect(
        host="127.0.0.1",
        port=int(stack.env["STACK_POSTGRES_PORT"]),
        user="mlflow",
        password=stack.secret("MLFLOW_DB_PASSWORD"),
        dbname="mlflow",
    ) as conn:
        rows = conn.execute("SELECT name, version FROM model_versions ORDER BY name").fetchall()
        tags = dict(conn.execute("SELECT key, value FROM model_version_tags WHERE name = 'chat'").fetchall())
    assert ("chat", 1) in rows and ("chat-base", 1) in rows
    assert tags["lineage.snapshot"] == summary["train"]["snapshot"] and tags["gate.status"] == "passed"
    version = httpx.get(
        f"{stack.mlflow}/api/2.0/mlflow/model-versions/get", params={"name": "chat", "version": "1"}, timeout=30
    ).json()["model_version"]
    assert version["source"].startswith(("mlflow-artifacts:", "models:")), version["source"]
    assert list((stack.home / "artifacts").rglob("model.safetensors")), "no weights in the proxied artifact store"
    assert not (home / "mlflow" / "mlflow.db").exists(), "the trainer kept a local registry"

    # the registry UI's promotion: alias 'challenger' through the server's REST API
    before = datetime.now(UTC).isoformat()
    r = httpx.post(
        f"{stack.mlflow}/api/2.0/mlflow/registered-models/alias",
        json={"name": "chat", "alias": "challenger", "version": "1"},
        timeout=30,
    )
    assert r.status_code == 200, r.text
    stack.prefect.set_paused(CONTROLLER, False)
    # a scheduled controller run on a worker takes it: no champion yet, so it becomes champion directly
    wait_for("the controller to promote chat/1", lambda: aliases(stack, "chat").get("champion") == "1", 240, 2)
    assert "challenger" not in aliases(stack, "chat")
    model_tags = {t["key"]: t["value"] for t in mlflow_model(stack, "chat").get("tags", [])}
    assert model_tags["rollout.champion"] == "1"
    v1 = httpx.get(
        f"{stack.mlflow}/api/2.0/mlflow/model-versions/get", params={"name": "chat", "version": "1"}, timeout=30
    ).json()["model_version"]
    vtags = {t["key"]: t["value"] for t in v1["tags"]}
    assert vtags["rollout.status"] == "promoted"
    actor = vtags["alias.champion.by"]
    assert actor.startswith("flow-run:"), actor
    run = stack.prefect.run(actor.removeprefix("flow-run:"))
    assert run["deployment_id"] == stack.prefect.deployment(CONTROLLER)["id"] and run["expected_start_time"] > before
    assert ran_on(stack, run) in (["worker-1"], ["worker-2"])
    # the run's log reaches the server in batches: the alias can move before its line arrives
    wait_for(
        "the run's log of the promotion", lambda: any("promote" in m for _, m in stack.prefect.logs(run["id"])), 60
    )
    decisions = (stack.home / "home" / "logs" / "rollout-decisions.jsonl").read_text().splitlines()
    assert json.loads(decisions[-1])["action"] == "promote"  # written in the workers' home folder


def test_a_run_killed_with_its_worker_is_crashed_rescheduled_and_run_by_the_other_worker_never_twice_at_once(
    stack: NativeStack,
) -> None:
    api = stack.prefect
    api.set_paused(CONTROLLER, False)
    since = datetime.now(UTC).isoformat()
    # scheduled controller runs execute on the workers
    wait_for(
        "a scheduled controller run to complete on a worker",
        lambda: [r for r in api.runs(CONTROLLER, since=since) if r["state_type"] == "COMPLETED"],
        180,
        2,
    )
    # another tick holds the controller's lock (as `lifecycle rollout tick` run by hand would): the next
    # scheduled run starts on a worker and waits in it, mid-run
    lease = api.hold_lock(LOCK, lease_s=600)
    try:
        waiting = wait_for(
            "a controller run waiting for the lock",
            lambda: [
                r
                for r in api.runs(CONTROLLER, since=since)
                if r["state_type"] == "RUNNING" and any("waiting for lock" in m for _, m in api.logs(r["id"]))
            ],
            180,
            1,
        )[0]
        victim = running_on(stack, waiting["id"])
        # the crash automation watches a run from its first heartbeat on (sent as the run starts, in a batch of
        # events of its own): a worker killed before that batch reached the server leaves the run Running, the
        # case docs/production.md lists with the Pending one
        wait_for("the run's first heartbeat", lambda: api.events(waiting["id"], "prefect.flow-run.heartbeat"), 60, 1)
        stack.kill(victim)
        killed = time.monotonic()
        # the runs that fall due while the dead run holds the deployment's slot are cancelled; once one was, the
        # schedule is paused: a newer run that took the slot freed by the crash would cancel the rescheduled
        # attempt instead (the newer tick doing its work), which is not the path this test follows
        wait_for(
            "a run due meanwhile to be cancelled by the deployment's concurrency limit",
            lambda: [
                r
                for r in api.runs(CONTROLLER, since=since)
                if r["state_type"] == "CANCELLED" and "concurrency limit" in (r["state"]["message"] or "")
            ],
            CRASH_AFTER_S,
            1,
        )
        api.set_paused(CONTROLLER, True)  # deletes the runs scheduled ahead; a rescheduled run is kept
        # Prefect marks it Crashed once its heartbeats stop, then the automation reschedules it: the other worker
        try:
            second = wait_for(
                "the crashed run to run again",
                lambda: (r := api.run(waiting["id"]))["run_count"] == 2 and r["state_type"] == "RUNNING" and r,
                CRASH_AFTER_S + 180,
                1,
            )
        except AssertionError as exc:
            states = [(s["type"], s["name"], s["timestamp"]) for s in api.states(waiting["id"])]
            beats = [e["occurred"] for e in api.events(waiting["id"], "prefect.flow-run.heartbeat")]
            raise AssertionError(f"{exc}; states {states}; heartbeats {beats}") from None
        detected_s = time.monotonic() - killed
        rerun_on = running_on(stack, waiting["id"])
        assert rerun_on != victim and sorted(ran_on(stack, second)) == sorted(stack.workers), (victim, rerun_on)
        # `scripts/stack.sh status` shows the same: the dead worker stopped, the other one healthy
        status = {line.split()[0]: line.split()[-1] for line in stack.status().splitlines()}
        assert (status[victim], status[rerun_on], status["prefect-server"]) == ("stopped", "healthy", "healthy")
        kinds = [(s["type"], s["name"]) for s in api.states(waiting["id"])]
        crashed = kinds.index(("CRASHED", "Crashed"))
        assert kinds[crashed + 1] == ("SCHEDULED", "Rescheduled") and kinds[-1] == ("RUNNING", "Running"), kinds
        assert second["run_count"] == 2
        # nothing ran twice at once: the runs due while the dead worker's run held the deployment's slot were
        # cancelled, and the rescheduled attempt waits for the lock like the first did
        cancelled = [r for r in api.runs(CONTROLLER, since=since) if r["state_type"] == "CANCELLED"]
        assert cancelled and all("concurrency limit" in (r["state"]["message"] or "") for r in cancelled)
        wait_for(
            "the second attempt to wait for the lock",
            lambda: sum("waiting for lock" in m for _, m in api.logs(waiting["id"])) == 2,
            60,
            1,
        )
    finally:
        api.release(lease)
    wait_for("the rescheduled run to complete", lambda: api.run(waiting["id"])["state_type"] == "COMPLETED", 120, 1)
    api.set_paused(CONTROLLER, True)  # no new runs while the spans are read
    wait_for(
        "the runs in flight to end",
        lambda: not [r for r in api.runs(CONTROLLER, since=since) if r["state_type"] in ("PENDING", "RUNNING")],
        120,
        1,
    )
    # every run's tick (lock held -> finished) after the one before ended, the killed attempt's never began.
    # A run logs "Finished in state" after its final state is set, and its logs reach the API in batches
    # (logging.to_api.batch_interval): wait for the last batch of each run that ran before reading the spans
    runs = api.runs(CONTROLLER, since=since)
    ran = [r["id"] for r in runs if r["state_type"] in ("COMPLETED", "FAILED")]
    wait_for(
        "every run's final log line",
        lambda: all(any(m.startswith("Finished in state") for _, m in api.logs(i)) for i in ran),
        30,
        1,
    )
    spans = []
    for r in runs:
        logs = api.logs(r["id"])
        held = [t for t, m in logs if m.startswith("holding lock")]
        ended = [t for t, m in logs if m.startswith("Finished in state")]
        assert len(held) == len(ended), (r["name"], logs)
        spans += list(zip(held, ended, strict=True))
    spans.sort()
    assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:], strict=False)), spans
    assert sum("holding lock" in m for _, m in api.logs(waiting["id"])) == 1  # the second attempt only
    print(f"crash detected and the run restarted on {rerun_on} {detected_s:.0f} s after the kill")
