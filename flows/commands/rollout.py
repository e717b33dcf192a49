"""Progressive-delivery commands: ``promote``, ``rollback``, ``rollout`` (tick, status), ``watch`` (Alertmanager's
receiver) and ``traffic`` (simulated users against an endpoint)."""

from __future__ import annotations

import asyncio
import sys
from dataclasses import asdict

from core.errors import ConfigError
from flows.commands.base import Arg, Context, command, stop_on_term
from flows.commands.render import status_lines
from flows.traffic import TrafficReport, replay, traffic_prompts

NAME = Arg("name", help="registered model name (e.g. chat)")
REASON = Arg("--reason", help="why (recorded on the version and in the audit log)")


@command(
    "promote",
    help="make a gated version the challenger: the rollout controller shadows, canaries and promotes it "
    "(same as setting alias 'challenger' in the MLflow UI)",
    example="lifecycle promote chat 5 --reason 'better on facts'\n"
    "  lifecycle promote chat 4 --force --reason 'the slow engine was fixed'   # clears a quarantine",
    args=[
        NAME,
        Arg("version", help="version number"),
        REASON,
        Arg("--force", action="store_true", help="clear a quarantine from an earlier rollback"),
    ],
)
def promote(ctx: Context) -> int:
    from flows.rollout import promote as give_challenger

    args = ctx.args
    message = give_challenger(ctx.config, ctx.home, args.name, args.version, reason=args.reason or "", force=args.force)
    ctx.emit({"model": args.name, "version": args.version, "alias": "challenger", "message": message}, [message])
    return 0


@command(
    "rollback",
    help="the big red button: the canary (or, with none, the champion) goes back now and is quarantined",
    example="lifecycle rollback chat --reason 'users report loops'",
    args=[NAME, REASON],
)
def rollback(ctx: Context) -> int:
    from flows.rollout import rollback as roll_back

    d = roll_back(ctx.config, ctx.home, ctx.args.name, reason=ctx.args.reason or "")
    ctx.emit(asdict(d), [f"rolled back {d.model}/{d.version}: weight 0, quarantined", f"  {d.reason}"])
    return 0


@command(
    "rollout",
    help="the rollout controller: 'tick' runs one analysis (a Prefect flow), 'status' shows weights, step, "
    "per-version metrics and the last decisions",
    example="lifecycle rollout tick\n  lifecycle rollout status\n  lifecycle rollout status --json",
    args=[Arg("action", choices=["tick", "status"], help="what to do")],
)
def rollout(ctx: Context) -> int:
    from flows.rollout import rollout_controller_flow, rollout_status

    if ctx.args.action == "tick":
        decisions = rollout_controller_flow(ctx.config, ctx.home)
        lines = [f"{d['at']}  {d['model']}/{d['version']}  {d['action']}: {d['reason']}" for d in decisions]
        ctx.emit({"decisions": decisions}, lines or ["nothing to do: no challenger and no watch in progress"])
        return 0
    status = rollout_status(ctx.config, ctx.home)
    ctx.emit(asdict(status), status_lines(status))
    return 0


@command(
    "watch",
    help="the champion watch: Alertmanager's webhook receiver (POST /alerts). Records every alert on the champion "
    "and in the rollout log; a severe SLO or safety breach soon after a promotion rolls back to previous-champion",
    example="lifecycle watch --set monitoring.watch.port=9095\n"
    "  # infra/alertmanager/alertmanager.yml: webhook_configs url http://127.0.0.1:9095/alerts",
)
def watch(ctx: Context) -> int:
    from flows.watch import open_watch, watch_server

    cfg = ctx.config.monitoring.watch
    server = watch_server(open_watch(ctx.config, ctx.home), cfg.host, cfg.port)
    print(f"champion watch on http://{cfg.host}:{server.server_address[1]}/alerts", file=sys.stderr)
    stop_on_term()
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


@command(
    "traffic",
    help="replay held-out prompts against the endpoint at a given rate and concurrency (simulated users)",
    example="lifecycle traffic --url http://127.0.0.1:3000/v1 --key lc-... --rate 4 --concurrency 4 --duration 60\n"
    "  lifecycle traffic --url http://127.0.0.1:3000/v1 --key lc-... --requests 100 --profile drifted",
    args=[
        Arg("--url", default="http://127.0.0.1:3000/v1", help="OpenAI base URL of the endpoint"),
        Arg("--key", help="API key (lifecycle keys create traffic)"),
        Arg("--model", default="chat", help="model name to request (default: chat)"),
        Arg("--rate", type=float, default=4.0, help="requests per second (default: 4)"),
        Arg("--concurrency", type=int, default=4, help="requests in flight at most (default: 4)"),
        Arg("--duration", type=float, help="seconds to run (cycling the prompts)"),
        Arg("--requests", type=int, help="number of prompts (default: 200)"),
        Arg("--max-tokens", type=int, default=32, help="max_tokens per request (default: 32)"),
        Arg("--profile", default="normal", help="traffic mix: normal, drifted, safety"),
        Arg("--seed", type=int, default=0, help="seed of the prompt draw"),
    ],
)
def traffic(ctx: Context) -> int:
    args = ctx.args
    if not args.key:
        raise ConfigError("traffic needs an API key: --key lc-... (lifecycle keys create traffic)")
    n = args.requests or 200
    prompts = traffic_prompts(ctx.config.data.generator, args.profile, n, seed=args.seed)

    def progress(r: TrafficReport) -> None:
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
