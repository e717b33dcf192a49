"""The ``lifecycle`` command line: one subcommand per stage, built on the same functions the flows call.

    lifecycle run                                  # the whole loop on the default config
    lifecycle snapshot --json                      # build (or find) the data snapshot, print its hash
    lifecycle bootstrap --config configs/tiny.yaml # tokenizer + small base model, offline
    lifecycle config --set snapshot.test_fraction=0.2

Every subcommand takes ``--config FILE``, ``--set KEY=VALUE`` (repeatable), ``--home DIR`` and ``--json``.
User errors are one line on stderr (exit 2 for config and usage errors, 1 for the rest); unexpected errors are
one line plus a log file holding the traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import sys
import traceback
from collections.abc import Callable, Sequence
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, NoReturn, TextIO

from core import runtime
from core.errors import ConfigError, LifecycleError
from core.home import Home
from flows.config import LifecycleConfig, load_config

PROG = "lifecycle"


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see '{self.prog} --help')\n")


class Context:
    """What every command gets: the resolved config, the home folder and the output mode."""

    def __init__(self, args: argparse.Namespace, out: TextIO) -> None:
        self.args = args
        self.out = out
        self.config: LifecycleConfig = load_config(Path(args.config) if args.config else None, args.set)
        self.home: Home = self.config.resolve_home(args.home)
        self.json: bool = args.json
        runtime.configure(self.home)

    def emit(self, payload: dict[str, Any], human: Sequence[str]) -> None:
        if self.json:
            print(json.dumps(payload, indent=2, default=str), file=self.out)
        else:
            print("\n".join(human), file=self.out)


# --- commands ---------------------------------------------------------------------------------------------


def cmd_config(ctx: Context) -> int:
    from core.config import dump_yaml

    if ctx.json:
        print(json.dumps(ctx.config.model_dump(mode="json"), indent=2), file=ctx.out)
    else:
        print(f"# home: {ctx.home.root}\n" + dump_yaml(ctx.config), end="", file=ctx.out)
    return 0


def cmd_snapshot(ctx: Context) -> int:
    from flows.stages import snapshot_stage

    cfg = ctx.config
    if ctx.args.source:
        cfg = cfg.model_copy(
            update={"data": cfg.data.model_copy(update={"sources": cfg.data.sources + ctx.args.source})}
        )
    if ctx.args.drop_invalid:
        cfg = cfg.model_copy(update={"snapshot": cfg.snapshot.model_copy(update={"on_invalid": "drop"})})
    snap = snapshot_stage(cfg, ctx.home)
    m = snap.manifest
    rejected = m["rejected"]
    ctx.emit(
        {"hash": snap.hash, "path": str(snap.path), "counts": m["counts"], "rejected": rejected},
        [
            f"snapshot {snap.hash}",
            f"  path      {snap.path}",
            "  records   " + ", ".join(f"{k} {v}" for k, v in m["counts"].items()),
            f"  rejected  {rejected['total']}"
            + (
                " (" + ", ".join(f"{k} {v}" for k, v in rejected["by_reason"].items()) + ")"
                if rejected["total"]
                else ""
            ),
        ],
    )
    return 0


def cmd_bootstrap(ctx: Context) -> int:
    from flows.stages import base_model_stage, snapshot_stage

    if ctx.config.base_model:
        model = base_model_stage(ctx.config, ctx.home, snapshot=None)
        ctx.emit(
            {"path": str(model.path), "skipped": True},
            [f"base_model is set ({model.path}): nothing to bootstrap"],
        )
        return 0
    snap = snapshot_stage(ctx.config, ctx.home)
    model = base_model_stage(ctx.config, ctx.home, snap, progress=not ctx.json)
    man = model.manifest
    metrics = man["metrics"]
    ctx.emit(
        {
            "path": str(model.path),
            "snapshot": snap.hash,
            "weights_hash": man["weights_hash"],
            "tokenizer_hash": man["tokenizer_hash"],
            "chat_template_hash": man["chat_template_hash"],
            "metrics": metrics,
        },
        [
            f"base model {model.path}",
            f"  snapshot      {snap.hash}",
            f"  parameters    {metrics['parameters']:,}",
            f"  loss          {metrics['initial_loss']:.3f} -> {metrics['final_loss']:.3f} "
            f"(validation {metrics['final_val_loss']:.3f}; unigram floor {metrics['unigram_entropy']:.3f})",
            f"  weights hash  {man['weights_hash']}",
        ],
    )
    return 0


def _train_lines(summary: Any, home: Home) -> list[str]:
    m = summary.metrics
    base = summary.base_model_metrics
    base_loss = (
        f"loss {base['final_loss']:.3f} vs unigram floor {base['unigram_entropy']:.3f}"
        if "final_loss" in base
        else "external"
    )
    secs = summary.seconds
    return [
        f"  flow run    {summary.flow_run_id}",
        f"  snapshot    {summary.snapshot[:12]}  "
        + ", ".join(f"{k} {v}" for k, v in summary.snapshot_counts.items())
        + f"  ({secs.get('snapshot', 0):.1f}s)",
        f"  base model  {summary.base_model_version}  ({base_loss}; {secs.get('base_model', 0):.1f}s)",
        f"  fine-tune   {summary.lineage.get('method')}: val loss {m['val_loss_initial']:.3f} -> {m['val_loss']:.3f}, "
        f"{m['tokens_per_s']:,.0f} tokens/s  ({secs.get('finetune', 0):.1f}s)",
        f"  registered  {summary.model}/{summary.version}  (alias candidate; `lifecycle lineage {summary.model} "
        f"{summary.version}`)",
        f"  home        {home.root}",
    ]


def cmd_train(ctx: Context) -> int:
    from flows.stages import preflight

    preflight(ctx.config, ctx.home, ctx.args.snapshot)
    from flows.pipeline import train_flow

    summary = train_flow(ctx.config, ctx.home, ctx.args.snapshot)
    ctx.emit(asdict(summary), ["", "lifecycle train: done", *_train_lines(summary, ctx.home)])
    return 0


def cmd_run(ctx: Context) -> int:
    from flows.stages import gate_policy, preflight

    preflight(ctx.config, ctx.home)
    gate_policy(ctx.config)  # a broken gate file fails now, not after training
    from flows.pipeline import lifecycle_run

    cfg = ctx.config
    if ctx.args.traffic_profile:
        from flows.traffic import PROFILES

        if ctx.args.traffic_profile not in PROFILES:
            raise ConfigError(f"unknown traffic profile {ctx.args.traffic_profile!r}: use one of {', '.join(PROFILES)}")
        traffic = cfg.run.traffic.model_copy(update={"profile": ctx.args.traffic_profile})
        cfg = cfg.model_copy(update={"run": cfg.run.model_copy(update={"traffic": traffic})})
    summary = lifecycle_run(cfg, ctx.home)
    ctx.emit(
        asdict(summary),
        [
            "",
            f"lifecycle run: done in {summary.seconds:.0f}s",
            *_train_lines(summary.train, ctx.home),
            *_gate_lines(summary.gate),
            *_rollout_lines(summary.rollout),
            *_drift_lines(summary.drift),
            *_retrain_lines(summary.retrain),
            "",
            *_summary_table(summary, cfg, ctx.home),
        ],
    )
    if not summary.gate.passed:
        return 3
    return 4 if summary.rollout is not None and summary.rollout.outcome == "rolled-back" else 0


def _drift_lines(d: dict[str, Any] | None) -> list[str]:
    if d is None:
        return []
    drift = d["drift"]
    return [
        f"  drift       {drift['status'].upper()}: {drift['reason']}",
        f"              {drift['current_n']} prompts vs {drift['reference_n']} of {drift['champion']}'s data "
        f"({drift['seconds']:.1f}s); report {drift['html']}",
        f"  retrain     {d['summary']}",
    ]


def _retrain_lines(r: Any) -> list[str]:
    if r is None:
        return []
    return [
        f"  retrained   {r.train.model}/{r.train.version} on snapshot {r.snapshot[:12]} (with curated conversations)",
        *_gate_lines(r.gate),
        *_rollout_lines(r.rollout),
    ]


def _summary_table(s: Any, cfg: LifecycleConfig, home: Home) -> list[str]:
    """Versions, gate results and rollout outcomes in one table, then where to look (MLflow, Prefect)."""
    rows = [("version", "snapshot", "gate", "rollout")]
    for train, gate, rollout in [(s.train, s.gate, s.rollout)] + (
        [(s.retrain.train, s.retrain.gate, s.retrain.rollout)] if s.retrain else []
    ):
        outcome = rollout.outcome if rollout else ("-" if gate.passed else "stopped at the gate")
        rows.append(
            (f"{train.model}/{train.version}", train.snapshot[:12], "passed" if gate.passed else "FAILED", outcome)
        )
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    lines = ["  " + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    lines.insert(1, "  " + "  ".join("-" * w for w in widths))
    from registry.store import local_tracking_uri

    tracking = cfg.registry.tracking_uri or local_tracking_uri(home)
    lines += [
        "",
        f"  MLflow      {tracking}  (browse: lifecycle ui; model '{s.train.model}', experiment "
        f"'{cfg.registry.experiment}')",
        f"  Prefect     flow run {s.train.flow_run_id} and the rest of this run in `lifecycle ui` "
        f"(Prefect home {home.prefect})",
    ]
    return lines


def cmd_monitor(ctx: Context) -> int:
    from flows.monitor import monitor_stage

    result = monitor_stage(ctx.config, ctx.home)
    r = result.report
    ctx.emit(
        result.to_json(),
        [
            f"drift {r.status.upper()}: {r.reason}",
            f"  window      {r.current_n} prompts of the last {ctx.config.monitoring.drift.window_hours:g} h "
            f"vs {r.reference_n} training prompts of {result.champion} (snapshot {result.snapshot[:12]})",
            *[f"  {k:<40} {v:.4g}" for k, v in sorted(r.metrics().items())],
            f"  report      {result.folder / 'drift.html'}  (MLflow run {result.run_id})",
        ],
    )
    return 0


def cmd_retrain(ctx: Context) -> int:
    from flows.monitor import retrain_check_flow

    out = retrain_check_flow(ctx.config, ctx.home, dry_run=ctx.args.dry_run)
    lines = [f"drift {out['drift']['status'].upper()}: {out['drift']['reason']}", f"{out['summary']}"]
    if "retrained" in out:
        r = out["retrained"]
        lines.append(f"retrained {ctx.config.registry.model_name}/{r['version']}: gate {r['gate']}")
        if r.get("challenger"):
            lines.append("  it is the challenger now: the rollout controller shadows and canaries it")
    ctx.emit(out, lines)
    return 0


def _rollout_lines(r: Any) -> list[str]:
    if r is None:
        return []
    aliases = ", ".join(f"{a}={r.model}/{v}" for a, v in sorted(r.aliases.items()))
    lines = [f"  rollout     {r.model}/{r.version}: {r.outcome.upper()} ({r.seconds:.0f}s)  aliases: {aliases}"]
    if r.traffic:
        lines.append(
            f"              simulated traffic: {r.traffic['sent']} requests, by version {r.traffic['by_version']}"
        )
    lines += [f"              {d['action']:<8} {d['weight']:>3}%  {d['reason']}" for d in r.decisions]
    return lines


def _suite_lines(report: Any) -> list[str]:
    lines = []
    for suite in report.suites:
        lines.append(f"  {suite.name} ({suite.seconds:.1f}s)")
        for m in suite.metrics:
            err = f" ± {m.stderr:.3f}" if m.stderr is not None else ""
            arrow = "↑" if m.higher_is_better else "↓"
            lines.append(f"    {m.name.split('/', 1)[1]:<34} {m.value:8.3f}{err}  {arrow}  (n={m.n})")
    return lines


def cmd_eval(ctx: Context) -> int:
    from flows.stages import eval_sets_stage, eval_suites, evaluate_stage, open_registry

    args = ctx.args
    eval_suites(ctx.config)  # a bad suite name fails before anything loads

    def progress(result: Any) -> None:
        if not ctx.json:
            print(f"  {result.name}: done in {result.seconds:.1f}s", file=sys.stderr)

    if args.url:
        from evals.runner import UrlTarget, run_eval

        if not (args.served_model and args.snapshot):
            raise ConfigError("lifecycle eval --url needs --served-model NAME and --snapshot HASH (the eval data)")
        sets = eval_sets_stage(ctx.config, ctx.home, args.snapshot)
        target = UrlTarget(
            label=args.url,
            base_url=args.url,
            model=args.served_model,
            api_key=args.api_key,
            api=args.api,
            tokenizer=args.tokenizer,
        )
        report = run_eval(ctx.config.evals, target, sets, eval_suites(ctx.config), on_suite=progress)
        path = report.save(ctx.home.reports / "evals" / "url" / f"{sets.hash[:16]}.json")
    else:
        if not (args.name and args.version):
            raise ConfigError("lifecycle eval needs NAME VERSION (a registered version) or --url")
        ref = f"{args.name}/{args.version}"
        sets = None
        if args.snapshot:
            sets = eval_sets_stage(ctx.config, ctx.home, args.snapshot)
        open_registry(ctx.config, ctx.home).get(args.name, args.version)  # a clear error before any engine starts
        report = evaluate_stage(ctx.config, ctx.home, ref, sets=sets, force=args.force, on_suite=progress)
        path = ctx.home.reports / "evals" / f"{args.name}-{args.version}"
    ctx.emit(
        report.model_dump(mode="json", exclude={"suites": {"__all__": {"metrics": {"__all__": {"items", "weights"}}}}}),
        [
            f"eval {report.model}  eval sets {report.eval_sets[:16]}  seed {report.seed}  {report.seconds:.1f}s",
            *_suite_lines(report),
            f"  report      {path}",
        ],
    )
    return 0


def _gate_lines(g: Any) -> list[str]:
    lines = [
        f"  gate        {'PASSED' if g.passed else 'FAILED'}: {g.model}/{g.version} "
        f"(policy {g.policy}, champion {g.champion or 'none'})",
        f"              {g.summary}",
        "              " + ", ".join(f"{k} {v:.1f}s" for k, v in g.seconds_per_suite.items()),
        f"  reports     {g.report_dir}  (MLflow run {g.run_id})",
    ]
    return lines


def cmd_gate(ctx: Context) -> int:
    from flows.stages import gate_policy, open_registry

    gate_policy(ctx.config)
    open_registry(ctx.config, ctx.home).get(ctx.args.name, ctx.args.version)
    from flows.pipeline import evaluate_flow

    summary = evaluate_flow(ctx.config, ctx.home, f"{ctx.args.name}/{ctx.args.version}", ctx.args.force)
    ctx.emit(asdict(summary), ["", "lifecycle gate: done", *_gate_lines(summary)])
    return 0 if summary.passed else 3


def cmd_lineage(ctx: Context) -> int:
    from flows.stages import open_registry

    version = open_registry(ctx.config, ctx.home).get(ctx.args.name, ctx.args.version)
    width = max((len(k) for k in version.lineage), default=0)
    ctx.emit(
        {
            "name": version.name,
            "version": version.version,
            "aliases": list(version.aliases),
            "run_id": version.run_id,
            "lineage": version.lineage,
        },
        [
            f"{version.name}/{version.version}  aliases: {', '.join(version.aliases) or '-'}  run: {version.run_id}",
            *(f"  {k:<{width}}  {v}" for k, v in version.lineage.items()),
        ],
    )
    return 0


def serve_spec(cfg: LifecycleConfig, home: Home) -> Any:
    """The serving part of the root config, as the BentoML service reads it."""
    from serving.runtime import ServeSpec

    return ServeSpec(
        home=str(home.root),
        serving=cfg.serving,
        registry=cfg.registry,
        model_name=cfg.serving.routing.model_name or cfg.registry.model_name,
    )


def _check_servable(cfg: LifecycleConfig, home: Home) -> None:
    """Fail in one line before spending half a minute on a server that cannot load its primary version."""
    from flows.stages import open_registry

    routing = cfg.serving.routing
    name = routing.model_name or cfg.registry.model_name
    reg = open_registry(cfg, home)
    try:
        reg.by_alias(name, routing.primary_alias)
    except LifecycleError:
        raise LifecycleError(
            f"no version of {name!r} has the alias {routing.primary_alias!r}, so there is nothing to serve: "
            f"promote a gated version, or serve another alias (--set serving.routing.primary_alias=candidate)"
        ) from None
    for ref in [routing.fallback, *routing.extra]:
        if ref:
            reg.parse(ref)


def cmd_serve(ctx: Context) -> int:
    from serving.launcher import GatewayProcess

    cfg = ctx.config
    updates: dict[str, Any] = {}
    if ctx.args.host:
        updates["host"] = ctx.args.host
    if ctx.args.port is not None:
        updates["port"] = ctx.args.port
    if updates:
        cfg = cfg.model_copy(update={"serving": cfg.serving.model_copy(update=updates)})
    _check_servable(cfg, ctx.home)
    gateway = GatewayProcess(serve_spec(cfg, ctx.home))
    print(f"starting the gateway on {gateway.url} (log: {gateway.log_path}) ...", file=sys.stderr)
    _stop_on_term()  # Ctrl-C or a TERM to us stops the gateway's whole process group, engines included
    gateway.start()
    try:
        gateway.wait_ready()
        ready = gateway.last_readiness
        ctx.emit(
            {"url": gateway.url, "openai_base_url": gateway.url + "/v1", "log": str(gateway.log_path), **ready},
            [
                f"gateway ready: {gateway.url}  (OpenAI base URL {gateway.url}/v1, chat page {gateway.url}/)",
                f"  serving {ready.get('primary')} as {cfg.serving.routing.served_name!r}"
                + (f", fallback {ready['fallback']}" if ready.get("fallback") else ""),
                f"  log: {gateway.log_path}",
                "  Ctrl-C stops it",
            ],
        )
        ctx.out.flush()
        assert gateway.proc is not None
        return gateway.proc.wait()
    except KeyboardInterrupt:
        print("stopping the gateway ...", file=sys.stderr)
        return 0
    finally:
        gateway.stop()


def cmd_keys(ctx: Context) -> int:
    from serving.runtime import database_url
    from serving.store import ServingStore

    args = ctx.args
    with ServingStore(database_url(serve_spec(ctx.config, ctx.home))) as store:
        if args.action == "create":
            if not args.name:
                raise ConfigError("keys create needs a NAME (lifecycle keys create my-app)")
            key, secret = store.create_key(
                args.name,
                requests_per_minute=args.rpm,
                tokens_per_minute=args.tpm,
                training_opt_in=args.training_opt_in,
            )
            ctx.emit(
                {
                    "id": key.id,
                    "name": key.name,
                    "key": secret,
                    "training_opt_in": key.training_opt_in,
                    **_key_limits(key),
                },
                [
                    f"created key {key.id} ({key.name}"
                    f"{'; its conversations may be curated into training data' if key.training_opt_in else ''}); "
                    "the secret is shown once:",
                    secret,
                ],
            )
        elif args.action == "list":
            keys = store.list_keys(include_revoked=args.all)
            ctx.emit(
                {"keys": [_key_json(k) for k in keys]},
                [f"{'id':<16} {'name':<20} {'prefix':<10} {'rpm':>6} {'tpm':>8} {'training':<8}  status"]
                + [
                    f"{k.id:<16} {k.name:<20} {k.prefix:<10} {k.requests_per_minute or '-':>6} "
                    f"{k.tokens_per_minute or '-':>8} {'opt-in' if k.training_opt_in else '-':<8}  "
                    f"{'revoked' if k.revoked_at else 'active'}"
                    for k in keys
                ],
            )
        else:
            if not args.name:
                raise ConfigError("keys revoke needs the key's id or name (lifecycle keys list shows them)")
            key = store.revoke_key(args.name)
            ctx.emit(_key_json(key), [f"revoked key {key.id} ({key.name})"])
    return 0


def _key_limits(key: Any) -> dict[str, Any]:
    return {"requests_per_minute": key.requests_per_minute, "tokens_per_minute": key.tokens_per_minute}


def _key_json(key: Any) -> dict[str, Any]:
    return {
        "id": key.id,
        "name": key.name,
        "prefix": key.prefix,
        "created_at": key.created_at.isoformat(),
        "revoked_at": key.revoked_at.isoformat() if key.revoked_at else None,
        "training_opt_in": key.training_opt_in,
        **_key_limits(key),
    }


def cmd_promote(ctx: Context) -> int:
    from flows.rollout import promote

    args = ctx.args
    message = promote(ctx.config, ctx.home, args.name, args.version, reason=args.reason or "", force=args.force)
    ctx.emit({"model": args.name, "version": args.version, "alias": "challenger", "message": message}, [message])
    return 0


def cmd_rollback(ctx: Context) -> int:
    from flows.rollout import rollback

    d = rollback(ctx.config, ctx.home, ctx.args.name, reason=ctx.args.reason or "")
    ctx.emit(asdict(d), [f"rolled back {d.model}/{d.version}: weight 0, quarantined", f"  {d.reason}"])
    return 0


def cmd_rollout(ctx: Context) -> int:
    from flows.rollout import rollout_status, status_lines

    if ctx.args.action == "tick":
        from flows.rollout import rollout_controller_flow

        decisions = rollout_controller_flow(ctx.config, ctx.home)
        lines = [f"{d['at']}  {d['model']}/{d['version']}  {d['action']}: {d['reason']}" for d in decisions]
        ctx.emit({"decisions": decisions}, lines or ["nothing to do: no challenger and no watch in progress"])
        return 0
    status = rollout_status(ctx.config, ctx.home)
    ctx.emit(asdict(status), status_lines(status))
    return 0


def _stop_on_term() -> None:
    """A TERM to us (a process manager, ``kill``) ends the command like Ctrl-C: servers stopped by group."""
    import signal

    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))


def cmd_schedule(ctx: Context) -> int:
    from flows.schedule import serve_schedules

    _stop_on_term()
    with contextlib.suppress(KeyboardInterrupt):
        serve_schedules(ctx.config, ctx.home, lambda line: print(line, file=sys.stderr, flush=True))
    print("schedules stopped", file=sys.stderr)
    return 0


def cmd_ui(ctx: Context) -> int:
    import time

    from flows.schedule import open_uis

    def wait(servers: list[Any]) -> None:
        while all(s.alive() for s in servers):
            time.sleep(0.5)
        raise LifecycleError("a UI server exited; see its log above")

    _stop_on_term()
    with contextlib.suppress(KeyboardInterrupt):
        open_uis(ctx.config, ctx.home, lambda line: print(line, file=sys.stderr, flush=True), wait)
    print("UIs stopped", file=sys.stderr)
    return 0


def cmd_traffic(ctx: Context) -> int:
    import asyncio

    from flows.traffic import replay, traffic_prompts

    args = ctx.args
    if not args.key:
        raise ConfigError("traffic needs an API key: --key lc-... (lifecycle keys create traffic)")
    n = args.requests or 200
    prompts = traffic_prompts(ctx.config.data.generator, args.profile, n, seed=args.seed)

    def progress(r: Any) -> None:
        if not ctx.json:
            print(f"  sent {r.sent}  ok {r.ok}  errors {sum(r.errors.values())}", file=sys.stderr)

    report = asyncio.run(
        replay(
            prompts if args.duration else prompts[:n],
            base_url=args.url,
            api_key=args.key,
            model=args.model,
            rate=args.rate,
            concurrency=args.concurrency,
            duration_s=args.duration,
            max_tokens=args.max_tokens,
            seed=args.seed,
            on_progress=progress,
        )
    )
    s = report.summary()
    ctx.emit(
        s,
        [
            f"traffic ({args.profile}): sent {s['sent']} in {s['seconds']}s ({s['rate']}/s), ok {s['ok']}, "
            f"errors {s['errors'] or 0}",
            *(f"  {v:<28} {n}" for v, n in sorted(s["by_version"].items())),
        ],
    )
    return 0


# --- parser -----------------------------------------------------------------------------------------------

COMMANDS: dict[str, tuple[Callable[[Context], int], str, str]] = {
    "run": (
        cmd_run,
        "run the whole loop as a Prefect flow: snapshot, base model, fine-tune, register, gate, then shadow and "
        "canary under simulated traffic (exit 3: the gate failed; 4: the rollout rolled the version back)",
        "lifecycle run\n  lifecycle run --config configs/tiny.yaml --home /tmp/demo",
    ),
    "monitor": (
        cmd_monitor,
        "drift report: the request log's recent prompts vs the champion's training data (Evidently descriptors + "
        "MiniLM embeddings), with safety-hit and refusal rates; HTML under reports/drift and in MLflow",
        "lifecycle monitor\n  lifecycle monitor --set monitoring.drift.window_hours=1 --json",
    ),
    "retrain": (
        cmd_retrain,
        "the retrain check (a Prefect flow): monitor, curate opted-in conversations, decide (drift and a quality "
        "signal, cooldown, loop guard); when triggered: train on the curated snapshot, gate, make it the challenger",
        "lifecycle retrain --dry-run\n  lifecycle retrain",
    ),
    "train": (
        cmd_train,
        "fine-tune with DeepSpeed and register the version in MLflow (a Prefect flow)",
        "lifecycle train --config configs/tiny.yaml\n"
        "  lifecycle train --set finetune.method=full --set finetune.deepspeed_config=infra/deepspeed/zero3.json",
    ),
    "eval": (
        cmd_eval,
        "run the eval suites (quality via lm-eval, toxicity, safety, over-refusal) on a version or a URL",
        "lifecycle eval chat 3\n  lifecycle eval chat-base 1 --json\n"
        "  lifecycle eval --url http://127.0.0.1:8000/v1 --served-model chat --snapshot 58434b85",
    ),
    "gate": (
        cmd_gate,
        "evaluate a version and its champion, decide the promotion gate, record it in MLflow (exit 3: failed)",
        "lifecycle gate chat 3\n  lifecycle gate chat 3 --set evals.gate=configs/gates/tiny.yaml --force",
    ),
    "serve": (
        cmd_serve,
        "start the OpenAI-compatible chat endpoint (BentoML + vLLM) on the versions the registry aliases name",
        "lifecycle serve\n  lifecycle serve --port 8000 --set serving.routing.fallback=chat@previous-champion\n"
        "  curl -N http://127.0.0.1:3000/v1/chat/completions -H 'Authorization: Bearer lc-...' "
        "-H 'Content-Type: application/json' "
        '-d \'{"model": "chat", "stream": true, "messages": [{"role": "user", "content": "Hi"}]}\'',
    ),
    "keys": (
        cmd_keys,
        "manage the endpoint's API keys (stored hashed; the secret is shown once)",
        "lifecycle keys create my-app --rpm 120 --tpm 50000\n  lifecycle keys list\n  lifecycle keys revoke my-app",
    ),
    "promote": (
        cmd_promote,
        "make a gated version the challenger: the rollout controller shadows, canaries and promotes it "
        "(same as setting alias 'challenger' in the MLflow UI)",
        "lifecycle promote chat 5 --reason 'better on facts'\n"
        "  lifecycle promote chat 4 --force --reason 'the slow engine was fixed'   # clears a quarantine",
    ),
    "rollback": (
        cmd_rollback,
        "the big red button: the canary (or, with none, the champion) goes back now and is quarantined",
        "lifecycle rollback chat --reason 'users report loops'",
    ),
    "rollout": (
        cmd_rollout,
        "the rollout controller: 'tick' runs one analysis (a Prefect flow), 'status' shows weights, step, "
        "per-version metrics and the last decisions",
        "lifecycle rollout tick\n  lifecycle rollout status\n  lifecycle rollout status --json",
    ),
    "traffic": (
        cmd_traffic,
        "replay held-out prompts against the endpoint at a given rate and concurrency (simulated users)",
        "lifecycle traffic --url http://127.0.0.1:3000/v1 --key lc-... --rate 4 --concurrency 4 --duration 60\n"
        "  lifecycle traffic --url http://127.0.0.1:3000/v1 --key lc-... --requests 100 --profile drifted",
    ),
    "schedule": (
        cmd_schedule,
        "run the loop on schedules until Ctrl-C: a local Prefect server (unless PREFECT_API_URL is set) serving "
        "the rollout controller (every minute), monitoring (15 min), the champion's eval (daily) and the retrain "
        "check (nightly)",
        "lifecycle schedule\n  lifecycle schedule --set schedule.monitor_every_s=300\n"
        "  PREFECT_API_URL=http://prefect:4200/api lifecycle schedule",
    ),
    "ui": (
        cmd_ui,
        "start the MLflow UI (the registry: set alias 'challenger' to promote) and the Prefect UI, print their "
        "URLs, stop both on Ctrl-C",
        "lifecycle ui\n  lifecycle ui --set schedule.mlflow_port=5001 --set schedule.prefect_port=4201",
    ),
    "lineage": (
        cmd_lineage,
        "print the lineage of a registered model version",
        "lifecycle lineage chat 1\n  lifecycle lineage chat-base 1 --json",
    ),
    "snapshot": (
        cmd_snapshot,
        "build (or find) the content-addressed data snapshot",
        "lifecycle snapshot --json\n  lifecycle snapshot --source my_chats/ --set data.generator.enabled=false"
        "\n  lifecycle snapshot --source raw.jsonl --drop-invalid",
    ),
    "bootstrap": (
        cmd_bootstrap,
        "train the tokenizer and small base model offline (skipped if it exists)",
        "lifecycle bootstrap --config configs/tiny.yaml\n  lifecycle bootstrap --json",
    ),
    "config": (
        cmd_config,
        "print the resolved config (after --config and --set)",
        "lifecycle config --config configs/tiny.yaml --set bootstrap.pretrain.steps=10",
    ),
}


def build_parser() -> argparse.ArgumentParser:
    common = _Parser(add_help=False)
    common.add_argument("--config", metavar="FILE", help="config file (default: configs/default.yaml)")
    common.add_argument(
        "--set",
        metavar="KEY=VALUE",
        action="append",
        default=[],
        help="override a config key, e.g. --set snapshot.test_fraction=0.2 (repeatable)",
    )
    common.add_argument("--home", metavar="DIR", help="state folder (default: $LIFECYCLE_HOME or ./.lifecycle)")
    common.add_argument("--json", action="store_true", help="print machine-readable JSON on stdout")

    parser = _Parser(
        prog=PROG,
        description="chat-lifecycle: data snapshots -> fine-tune -> registry -> "
        "gated evals -> canary rollouts -> drift-triggered retraining.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="examples:\n  lifecycle run\n  lifecycle snapshot --json\n"
        "  lifecycle bootstrap --config configs/tiny.yaml",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name, (func, help_text, example) in COMMANDS.items():
        p = sub.add_parser(
            name,
            parents=[common],
            help=help_text,
            description=help_text,
            epilog="example:\n  " + example,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        p.set_defaults(func=func)
        if name == "run":
            p.add_argument(
                "--traffic-profile",
                metavar="NAME",
                help="mix of the simulated users: normal, drifted (detects drift and retrains), safety",
            )
        if name == "retrain":
            p.add_argument("--dry-run", action="store_true", help="decide and record, do not retrain")
        if name == "train":
            p.add_argument("--snapshot", metavar="HASH", help="train on this existing snapshot (hash or prefix)")
        if name == "lineage":
            p.add_argument("name", help="registered model name (e.g. chat)")
            p.add_argument("version", help="version number")
        if name == "gate":
            p.add_argument("name", help="registered model name (e.g. chat)")
            p.add_argument("version", help="version number")
            p.add_argument("--force", action="store_true", help="re-run the suites even if a report is stored")
        if name == "eval":
            p.add_argument("name", nargs="?", help="registered model name (e.g. chat, chat-base)")
            p.add_argument("version", nargs="?", help="version number")
            p.add_argument("--force", action="store_true", help="re-run the suites even if a report is stored")
            p.add_argument("--snapshot", metavar="HASH", help="eval sets from this snapshot (default: the version's)")
            p.add_argument("--url", help="evaluate an OpenAI-compatible endpoint instead (e.g. http://host:8000/v1)")
            p.add_argument("--served-model", metavar="NAME", help="model name to request from --url")
            p.add_argument("--api-key", default="EMPTY", help="API key for --url (default: EMPTY)")
            p.add_argument(
                "--api",
                choices=["chat", "completions"],
                default="chat",
                help="with --url: chat (generative tasks only) or completions (every task; needs --tokenizer)",
            )
            p.add_argument("--tokenizer", metavar="DIR", help="with --api completions: the served model's tokenizer")
        if name == "serve":
            p.add_argument("--host", help="interface to bind (default: serving.host, 127.0.0.1)")
            p.add_argument("--port", type=int, help="port to bind (default: serving.port, 3000; 0 picks a free one)")
        if name == "keys":
            p.add_argument("action", choices=["create", "list", "revoke"], help="what to do")
            p.add_argument("name", nargs="?", help="create: a name for the key; revoke: its id or name")
            p.add_argument("--rpm", type=int, help="requests per minute for this key (default: serving.api_keys)")
            p.add_argument("--tpm", type=int, help="tokens per minute for this key (default: serving.api_keys)")
            p.add_argument(
                "--training-opt-in",
                action="store_true",
                help="this key's conversations may be curated into training data",
            )
            p.add_argument("--all", action="store_true", help="list: include revoked keys")
        if name == "promote":
            p.add_argument("name", help="registered model name (e.g. chat)")
            p.add_argument("version", help="version number")
            p.add_argument("--reason", help="why (recorded on the version and in the audit log)")
            p.add_argument("--force", action="store_true", help="clear a quarantine from an earlier rollback")
        if name == "rollback":
            p.add_argument("name", help="registered model name (e.g. chat)")
            p.add_argument("--reason", help="why (recorded on the version and in the audit log)")
        if name == "rollout":
            p.add_argument("action", choices=["tick", "status"], help="what to do")
        if name == "traffic":
            p.add_argument("--url", default="http://127.0.0.1:3000/v1", help="OpenAI base URL of the endpoint")
            p.add_argument("--key", help="API key (lifecycle keys create traffic)")
            p.add_argument("--model", default="chat", help="model name to request (default: chat)")
            p.add_argument("--rate", type=float, default=4.0, help="requests per second (default: 4)")
            p.add_argument("--concurrency", type=int, default=4, help="requests in flight at most (default: 4)")
            p.add_argument("--duration", type=float, help="seconds to run (cycling the prompts)")
            p.add_argument("--requests", type=int, help="number of prompts (default: 200)")
            p.add_argument("--max-tokens", type=int, default=32, help="max_tokens per request (default: 32)")
            p.add_argument("--profile", default="normal", help="traffic mix: normal, drifted, safety")
            p.add_argument("--seed", type=int, default=0, help="seed of the prompt draw")
        if name == "snapshot":
            p.add_argument(
                "--source",
                metavar="PATH",
                action="append",
                default=[],
                help="add a JSONL file or folder to data.sources (repeatable)",
            )
            p.add_argument(
                "--drop-invalid",
                action="store_true",
                help="drop records that break a contract (counted in the manifest) instead of failing",
            )
    return parser


def _log_crash(home: Home | None) -> Path:
    root = home.logs if home else Path.cwd()
    root.mkdir(parents=True, exist_ok=True)
    path = root / f"cli-error-{datetime.now(UTC).strftime('%Y%m%dT%H%M%S')}-{os.getpid()}.log"
    path.write_text(traceback.format_exc(), encoding="utf-8")
    return path


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    ctx: Context | None = None
    stdout = out = sys.stdout
    saved_fd: int | None = None
    if args.json:  # stdout carries the JSON alone: libraries that log to stdout are sent to stderr meanwhile
        saved_fd = _stdout_to_stderr()
        if saved_fd is not None:
            out = os.fdopen(os.dup(saved_fd), "w", encoding="utf-8")
        sys.stdout = sys.stderr
    try:
        ctx = Context(args, out)
        return int(args.func(ctx))
    except ConfigError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return exc.exit_code
    except LifecycleError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # a bug, not bad input: one line here, the traceback in a log file
        if os.environ.get("LIFECYCLE_DEBUG"):
            raise
        log = _log_crash(ctx.home if ctx else None)
        print(f"{PROG}: internal error: {type(exc).__name__}: {exc} (traceback: {log})", file=sys.stderr)
        return 1
    finally:
        sys.stdout = stdout
        if saved_fd is not None:
            out.close()
            os.dup2(saved_fd, stdout.fileno())
            os.close(saved_fd)


def _stdout_to_stderr() -> int | None:
    """Point file descriptor 1 at stderr (so child processes, such as vLLM's engine core, cannot write into the
    JSON either) and return a copy of the original; None when stdout is not a real file (a test capture)."""
    try:
        fd = sys.stdout.fileno()
    except (OSError, ValueError, io.UnsupportedOperation):
        return None
    sys.stdout.flush()
    saved = os.dup(fd)
    os.dup2(sys.stderr.fileno(), fd)
    return saved


if __name__ == "__main__":
    sys.exit(main())
