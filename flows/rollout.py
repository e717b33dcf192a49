"""Progressive delivery from the command line and Prefect: the controller flow, promote, rollback, status.

    lifecycle promote chat 5 --reason "better on facts"   # = alias challenger in the MLflow UI
    lifecycle rollout tick                                  # one controller analysis (the flow, scheduled every minute)
    lifecycle rollout status                                # weights, step, per-version metrics, last decisions
    lifecycle rollback chat --reason "users report loops"   # the big red button

The controller itself (``monitoring/controller.py``) is plain Python over two Protocols; this module wires it to
the MLflow registry and the serving database named by the root config, and publishes each tick's status as a
Prefect Markdown artifact. ``simulated_rollout_task`` is ``lifecycle run``'s rollout: the same controller ticking
under simulated users on a gateway started for the purpose (``simulate``).
"""

from __future__ import annotations

import asyncio
import getpass
import time
from collections.abc import Callable
from dataclasses import asdict
from datetime import UTC, datetime, timedelta
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact
from prefect.runtime import flow_run

from core.errors import RolloutError
from core.home import Home
from flows.config import LifecycleConfig
from flows.lock import attempt_guard, held_lock, lock_name
from flows.stages import open_registry, open_serving_store, serve_spec
from flows.summaries import RolloutStatus, RolloutSummary, stat_cell
from flows.traffic import replay, traffic_prompts
from monitoring.controller import (
    ACCEPTED_CHAMPION_TAG,
    CHALLENGER,
    CHAMPION,
    QUARANTINE_TAG,
    Decision,
    RolloutController,
    gate_passed,
    quarantined,
)
from monitoring.rollout import RolloutState
from monitoring.window import version_stats
from serving.config import ServingConfig
from serving.launcher import GatewayProcess


def cli_actor() -> str:
    try:
        return f"cli:{getpass.getuser()}"
    except Exception:  # no user name in some containers
        return "cli"


def open_controller(cfg: LifecycleConfig, home: Home, actor: str) -> RolloutController:
    """The controller on the registry and on the gateway's own view: the same database and served model name."""
    return RolloutController(
        open_registry(cfg, home),
        open_serving_store(cfg, home),
        cfg.rollout,
        serve_spec(cfg, home).model_name,
        actor=actor,
        decisions_path=home.decision_log("rollout"),
    )


# --- the controller flow ----------------------------------------------------------------------------------------


@flow(name="rollout-controller")
def rollout_controller_flow(cfg: LifecycleConfig, home: Home) -> list[dict[str, Any]]:
    """One analysis: guard the champion, admit or step the challenger, act, publish the status."""
    attempt_guard(cfg.schedule.crash_retries)
    logger = get_run_logger()
    controller = open_controller(cfg, home, actor=f"flow-run:{flow_run.get_id()}")
    # one tick at a time, even when Prefect wrongly believes an earlier one dead (flows/lock.py)
    with held_lock(lock_name("rollout", controller.name), lease_s=cfg.schedule.lock_lease_s):
        decisions = controller.tick()
    for d in decisions:
        (logger.warning if d.action in ("rollback", "revert", "reject") else logger.info)("%s", d.line())
    if not decisions:
        logger.info("nothing to do: no challenger and no watch in progress")
    status = rollout_status(cfg, home, controller)
    create_markdown_artifact(key="rollout-status", markdown=status_markdown(status), description="Rollout status")
    return [asdict(d) for d in decisions]


# --- manual commands --------------------------------------------------------------------------------------------


def promote(cfg: LifecycleConfig, home: Home, name: str, version: str, *, reason: str, force: bool) -> str:
    """Give ``version`` the challenger alias (the controller starts its rollout on its next tick). ``force``
    clears a quarantine left by an earlier rollback; it never skips the gate."""
    controller = open_controller(cfg, home, actor=cli_actor())
    reg = controller.reg
    mv = reg.get(name, version)
    if quarantined(mv):
        if not force:
            raise RolloutError(
                f"{mv.ref} is quarantined ({mv.tags.get('rollout.quarantine_reason', 'rolled back')}); "
                "to roll it out again: lifecycle promote --force --reason '...'"
            )
        if not reason:
            raise RolloutError("--force needs --reason: why the quarantine no longer applies")
        reg.set_tags(name, version, {QUARANTINE_TAG: "false", "rollout.quarantine_cleared": reason})
        reg.delete_tags(name, version, ["rollout.rejected", "rollout.rejected_at"])
    if not gate_passed(mv):
        raise RolloutError(
            f"{mv.ref} has no passing gate record (gate.status={mv.tags.get('gate.status', 'missing')}): "
            f"run lifecycle gate {name} {version} first"
        )
    dep = reg.deployment(name)
    if dep.aliases.get(CHAMPION) == version:
        raise RolloutError(f"{mv.ref} is already the champion")
    running = dep.aliases.get(CHALLENGER)
    if running is not None and running != version:
        raise RolloutError(f"{name}/{running} is being rolled out; wait for it or: lifecycle rollback {name}")
    reg.set_alias(name, CHALLENGER, version, reason=reason or "promoted from the CLI", actor=cli_actor())
    return f"{mv.ref} is now the challenger; the rollout controller takes it from here (lifecycle rollout status)"


def rollback(cfg: LifecycleConfig, home: Home, name: str, *, reason: str) -> Decision:
    """The big red button: the running canary (or, with none, the champion) goes back, now."""
    controller = open_controller(cfg, home, actor=cli_actor())
    reg = controller.reg
    dep = reg.deployment(name)
    why = f"manual rollback: {reason or 'no reason given'}"
    target = dep.aliases.get(CHALLENGER) or dep.aliases.get("shadow") or dep.aliases.get(CHAMPION)
    if target is None:
        raise RolloutError(f"{name} has no challenger and no champion: nothing to roll back")
    decision = controller.rollback(reg.get(name, target), why, dep=dep)
    controller.record(decision)
    return decision


# --- status -----------------------------------------------------------------------------------------------------


def rollout_status(cfg: LifecycleConfig, home: Home, controller: RolloutController | None = None) -> RolloutStatus:
    controller = controller or open_controller(cfg, home, actor=cli_actor())
    name = controller.name
    dep = controller.reg.deployment(name)
    state: RolloutState | None = None
    for alias in (CHALLENGER, CHAMPION):
        if alias in dep.aliases:
            state = RolloutState.from_tags(controller.reg.get(name, dep.aliases[alias]).tags) or state
            if state is not None:
                break
    since = state.phase_started_at if state else datetime.now(UTC) - timedelta(seconds=cfg.rollout.interval_s)
    rows = controller.requests.request_log(since=since)
    versions = {dep.aliases[a] for a in (CHAMPION, CHALLENGER) if a in dep.aliases}
    window = {}
    for v in sorted(versions, key=int):
        s = version_stats(rows, f"{name}/{v}")
        window[f"{name}/{v}"] = {
            "requests": s.n,
            "success_rate": s.success_rate,
            "ttft_p95_ms": s.percentile("ttft_ms", 95),
            "ttft_p99_ms": s.percentile("ttft_ms", 99),
            "tpot_p95_ms": s.percentile("tpot_ms", 95),
            "safety_hit_rate": s.safety_hit_rate,
            "refusal_rate": s.refusal_rate,
            "abort_rate": s.abort_rate,
            "rated": s.rated,
            "thumbs_down_rate": s.thumbs_down_rate if s.rated else None,
        }
    return RolloutStatus(
        model=name,
        aliases=dict(sorted(dep.aliases.items())),
        canary_weight=dep.canary_weight,
        accepted_champion=dep.tags.get(ACCEPTED_CHAMPION_TAG),
        state=asdict(state) if state else None,
        window=window,
        decisions=controller.decisions(10),
    )


def status_markdown(s: RolloutStatus) -> str:
    rows = "\n".join(f"| `{a}` | {s.model}/{v} |" for a, v in s.aliases.items())
    out = [f"# Rollout: {s.model}", "", f"Canary weight **{s.canary_weight}%**", "", "| alias | version |", "|---|---|"]
    out.append(rows)
    if s.state:
        st = s.state
        out += [
            "",
            f"Rollout of **{s.model}/{st['version']}**: {st['phase']}, step {st['step']}, weight {st['weight']}%,",
        ]
        out.append(f"passes {st['passes']}, failures {st['failures']}, window since {st['phase_started_at']}.")
    if s.window:
        keys = list(next(iter(s.window.values())).keys())
        out += ["", "| version | " + " | ".join(keys) + " |", "|---" * (len(keys) + 1) + "|"]
        out += [f"| {ref} | " + " | ".join(stat_cell(v[k]) for k in keys) + " |" for ref, v in s.window.items()]
    if s.decisions:
        out += ["", "| at | version | action | weight | reason |", "|---|---|---|---|---|"]
        out += [f"| {d.at} | {d.version} | {d.action} | {d.weight}% | {d.reason} |" for d in s.decisions]
    return "\n".join(out) + "\n"


# --- lifecycle run: a rollout under simulated users -------------------------------------------------------------

TERMINAL = ("rollback", "finish", "reject")
IN_PROGRESS = ("start", "hold", "advance")  # a first tick that leaves the rollout running: simulate users for it


def rollout_goes_on(decisions: list[dict[str, Any]]) -> bool:
    """Whether the controller's first tick left a rollout running: one it started now, or one an earlier run left
    unfinished (in shadow or canary), which a rerun of ``lifecycle run`` carries on under simulated users."""
    return bool(decisions) and decisions[-1]["action"] in IN_PROGRESS


def run_serving(cfg: LifecycleConfig) -> ServingConfig:
    """The serving config of the gateway ``lifecycle run`` starts: ``serving`` on a free port, its engines eager or
    compiled as ``run.enforce_eager`` says (null: as ``serving.engine`` says)."""
    serving = cfg.serving.model_copy(update={"port": 0})
    if cfg.run.enforce_eager is None:
        return serving
    engine = serving.engine.model_copy(update={"enforce_eager": cfg.run.enforce_eager})
    return serving.model_copy(update={"engine": engine})


def simulate(
    cfg: LifecycleConfig,
    home: Home,
    controller: RolloutController,
    decisions: list[dict[str, Any]],
    say: Callable[[str], None],
    *,
    rollout: bool = True,
    then_requests: int = 0,
) -> tuple[list[dict[str, Any]], dict[str, Any], tuple[datetime, datetime] | None]:
    """Start the gateway; with ``rollout``, play simulated users for one analysis interval at a time and tick the
    controller after each, until the rollout ends or ``run.max_ticks`` analyses passed; then play
    ``then_requests`` more on whatever serves now (the drift check's window, returned as ``(start, end)``). The
    simulated users' key opted in to training (their conversations are what a retrain curates) and stays active:
    curation only takes conversations of keys active and opted in when it runs. The gateway is stopped in every
    case."""
    spec = serve_spec(cfg.model_copy(update={"serving": run_serving(cfg)}), home)
    t = cfg.run.traffic
    per_tick = max(1, int(t.rate * cfg.rollout.interval_s))
    prompts = traffic_prompts(cfg.data.generator, t.profile, per_tick * 4)
    name = f"lifecycle-run-traffic-{datetime.now(UTC):%Y%m%dT%H%M%S}"
    with open_serving_store(cfg, home) as store:
        _, key = store.create_key(name, requests_per_minute=10**6, tokens_per_minute=10**9, training_opt_in=True)
    totals: dict[str, Any] = {"sent": 0, "ok": 0, "errors": {}, "by_version": {}, "profile": t.profile}

    def play(tick: int, prompts: list[str], **kwargs: Any) -> dict[str, Any]:
        report = asyncio.run(
            replay(
                prompts,
                base_url=gateway.url + "/v1",
                api_key=key,
                rate=t.rate,
                concurrency=t.concurrency,
                max_tokens=t.max_tokens,
                seed=tick,
                **kwargs,
            )
        )
        s = report.summary()
        totals["sent"] += s["sent"]
        totals["ok"] += s["ok"]
        for field_name in ("errors", "by_version"):
            for k, v in s[field_name].items():
                totals[field_name][k] = totals[field_name].get(k, 0) + v
        return s

    window = None
    say(f"starting the gateway (log: {home.logs}) ...")
    with GatewayProcess(spec) as gateway:
        for tick in range(cfg.run.max_ticks if rollout else 0):
            s = play(tick, prompts, duration_s=cfg.rollout.interval_s)
            made = [asdict(d) for d in controller.tick()]
            decisions += made
            for d in made:
                say(f"rollout: {d['action']} ({d['weight']}%): {d['reason']}  [traffic {s['by_version']}]")
            if any(d["action"] in TERMINAL for d in made):
                break
        if then_requests:
            say(f"simulated users: {then_requests} '{t.profile}' requests for the drift check ...")
            start = datetime.now(UTC)
            s = play(0, traffic_prompts(cfg.data.generator, t.profile, then_requests, seed=1))
            window = (start, datetime.now(UTC))
            say(f"  answered by {s['by_version']}")
    return decisions, totals, window


@task(name="simulated-rollout")
def simulated_rollout_task(
    cfg: LifecycleConfig, home: Home, model: str, version: str, then_requests: int = 0
) -> RolloutSummary:
    """Challenger -> the controller's ticks under simulated users on a gateway started for the purpose; then
    ``then_requests`` more simulated requests on whatever serves (the drift check's window)."""
    logger = get_run_logger()
    run_cfg = cfg.model_copy(update={"rollout": cfg.run.policy})
    t0 = time.perf_counter()
    controller = open_controller(run_cfg, home, actor=f"flow-run:{flow_run.get_id()}")
    unchanged = controller.reg.deployment(model).aliases.get(CHAMPION) == version
    decisions: list[dict[str, Any]] = []
    if not unchanged:
        promote(run_cfg, home, model, version, reason="lifecycle run: gate passed", force=False)
        decisions = [asdict(d) for d in controller.tick()]
    rolling = rollout_goes_on(decisions)
    traffic: dict[str, Any] = {}
    window = None
    if rolling or then_requests:
        decisions, traffic, window = simulate(
            run_cfg, home, controller, decisions, logger.info, rollout=rolling, then_requests=then_requests
        )
    outcome = "unchanged" if unchanged else _outcome([d["action"] for d in decisions])
    dep = controller.reg.deployment(model)
    (logger.info if outcome in ("promoted", "unchanged") else logger.warning)(
        "rollout of %s/%s: %s", model, version, outcome
    )
    return RolloutSummary(
        model, version, outcome, decisions, dep.aliases, traffic, time.perf_counter() - t0, window=window
    )


def _outcome(actions: list[str]) -> str:
    if "rollback" in actions:
        return "rolled-back"
    if "reject" in actions:
        return "rejected"
    if "promote" in actions:
        return "promoted"
    return "unfinished"


def rollout_markdown(r: RolloutSummary) -> str:
    rows = "\n".join(f"| {d['at']} | {d['action']} | {d['weight']}% | {d['reason']} |" for d in r.decisions)
    return (
        f"# Rollout of {r.model}/{r.version}: {r.outcome}\n\n| at | action | weight | reason |\n|---|---|---|---|\n"
        f"{rows}\n"
    )
