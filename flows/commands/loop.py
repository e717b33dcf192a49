"""The loop's commands: ``run`` (the whole loop), ``monitor`` (a drift report), ``retrain`` (the retrain check)."""

from __future__ import annotations

from dataclasses import asdict

from core.errors import ConfigError
from flows.commands.base import Arg, Context, command
from flows.commands.render import run_lines
from flows.traffic import PROFILES


@command(
    "run",
    help="run the whole loop as a Prefect flow: snapshot, base model, fine-tune, register, gate, then shadow and "
    "canary under simulated traffic (exit 3: the gate failed; 4: the rollout rolled the version back)",
    example="lifecycle run\n  lifecycle run --config configs/tiny.yaml --home /tmp/demo",
    args=[
        Arg(
            "--traffic-profile",
            metavar="NAME",
            help="mix of the simulated users: normal, drifted (detects drift and retrains), safety",
        )
    ],
)
def run(ctx: Context) -> int:
    from flows.gating import gate_policy
    from flows.stages import preflight

    preflight(ctx.config, ctx.home)
    gate_policy(ctx.config)  # a broken gate file fails now, not after training
    from flows.loop import lifecycle_run
    from registry.store import local_tracking_uri

    cfg = ctx.config
    if ctx.args.traffic_profile:
        if ctx.args.traffic_profile not in PROFILES:
            raise ConfigError(f"unknown traffic profile {ctx.args.traffic_profile!r}: use one of {', '.join(PROFILES)}")
        traffic = cfg.run.traffic.model_copy(update={"profile": ctx.args.traffic_profile})
        cfg = cfg.model_copy(update={"run": cfg.run.model_copy(update={"traffic": traffic})})
    summary = lifecycle_run(cfg, ctx.home)
    tracking = cfg.registry.tracking_uri or local_tracking_uri(ctx.home)
    ctx.emit(asdict(summary), run_lines(summary, cfg, ctx.home, tracking))
    if not summary.gate.passed:
        return 3
    return 4 if summary.rollout is not None and summary.rollout.outcome == "rolled-back" else 0


@command(
    "monitor",
    help="drift report: the request log's recent prompts vs the champion's training data (Evidently descriptors + "
    "MiniLM embeddings), with safety-hit and refusal rates; HTML under reports/drift and in MLflow",
    example="lifecycle monitor\n  lifecycle monitor --set monitoring.drift.window_hours=1 --json",
)
def monitor(ctx: Context) -> int:
    from flows.signals import monitor_stage

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


@command(
    "retrain",
    help="the retrain check (a Prefect flow): monitor, curate opted-in conversations (and their feedback into "
    "preference pairs), decide (drift and a quality "
    "signal, cooldown, loop guard); when triggered: train on the curated snapshot, gate, make it the challenger",
    example="lifecycle retrain --dry-run\n  lifecycle retrain",
    args=[Arg("--dry-run", action="store_true", help="decide and record, do not retrain")],
)
def retrain(ctx: Context) -> int:
    from flows.retrain import retrain_check_flow

    out = retrain_check_flow(ctx.config, ctx.home, dry_run=ctx.args.dry_run)
    lines = [
        f"drift {out['drift']['status'].upper()}: {out['drift']['reason']}",
        f"{out['summary']}",
        out["curation_summary"],
    ]
    if "retrained" in out:
        r = out["retrained"]
        lines.append(f"retrained {ctx.config.registry.model_name}/{r['version']}: gate {r['gate']}")
        if r.get("challenger"):
            lines.append("  it is the challenger now: the rollout controller shadows and canaries it")
    ctx.emit(out, lines)
    return 0
