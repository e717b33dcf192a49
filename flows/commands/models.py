"""Model commands: ``train`` (fine-tune and register), ``eval`` (the suites on a version or a URL), ``gate``
(evaluate, decide, record)."""

from __future__ import annotations

import sys
from dataclasses import asdict
from pathlib import Path

from core.errors import ConfigError
from evals.report import SuiteResult
from evals.runner import UrlTarget, run_eval
from flows.commands.base import Arg, Context, command
from flows.commands.render import gate_lines, suite_lines, train_lines

NAME = Arg("name", help="registered model name (e.g. chat)")
VERSION = Arg("version", help="version number")
FORCE = Arg("--force", action="store_true", help="re-run the suites even if a report is stored")


@command(
    "train",
    help="fine-tune with DeepSpeed and register the version in MLflow (a Prefect flow)",
    example="lifecycle train --config configs/tiny.yaml\n"
    "  lifecycle train --set finetune.method=full --set finetune.deepspeed_config=infra/deepspeed/zero3.json",
    args=[Arg("--snapshot", metavar="HASH", help="train on this existing snapshot (hash or prefix)")],
)
def train(ctx: Context) -> int:
    from flows.stages import preflight

    preflight(ctx.config, ctx.home, ctx.args.snapshot)
    from flows.train import train_flow

    summary = train_flow(ctx.config, ctx.home, ctx.args.snapshot)
    ctx.emit(asdict(summary), ["", "lifecycle train: done", *train_lines(summary, ctx.home)])
    return 0


@command(
    "train-node",
    help="run this node's ranks of a multi-node fine-tune (finetune.distributed.nnodes > 1) that node 0 started "
    "with lifecycle train; RUN_DIR is the run folder node 0 prints, on a filesystem every node shares",
    example="lifecycle train-node /shared/lifecycle/models/runs/3f9c2a... --node-rank 1   # on node 1, after node 0's\n"
    "  lifecycle train --set finetune.distributed.nnodes=2 --set finetune.distributed.master_addr=10.0.0.1\n"
    "  # printed the run folder; after a failure, rerun both to resume from the last checkpoint",
    args=[
        Arg("run_dir", metavar="RUN_DIR", help="the fine-tune's run folder (holds job.json)"),
        Arg("--node-rank", type=int, required=True, help="this node's rank, 1..nnodes-1 (node 0 is lifecycle train)"),
    ],
)
def train_node(ctx: Context) -> int:
    from training.finetune.launch import join

    join(Path(ctx.args.run_dir).resolve(), ctx.args.node_rank)
    ctx.emit({"run_dir": ctx.args.run_dir, "node_rank": ctx.args.node_rank, "ok": True}, ["node done"])
    return 0


@command(
    "eval",
    help="run the eval suites (quality via lm-eval, toxicity, safety, over-refusal) on a version or a URL",
    example="lifecycle eval chat 3\n  lifecycle eval chat-base 1 --json\n"
    "  lifecycle eval --url http://127.0.0.1:8000/v1 --served-model chat --snapshot 58434b85",
    args=[
        Arg("name", nargs="?", help="registered model name (e.g. chat, chat-base)"),
        Arg("version", nargs="?", help="version number"),
        FORCE,
        Arg("--snapshot", metavar="HASH", help="eval sets from this snapshot (default: the version's)"),
        Arg("--url", help="evaluate an OpenAI-compatible endpoint instead (e.g. http://host:8000/v1)"),
        Arg("--served-model", metavar="NAME", help="model name to request from --url"),
        Arg("--api-key", default="EMPTY", help="API key for --url (default: EMPTY)"),
        Arg(
            "--api",
            choices=["chat", "completions"],
            default="chat",
            help="with --url: chat (generative tasks only) or completions (every task; needs --tokenizer)",
        ),
        Arg("--tokenizer", metavar="DIR", help="with --api completions: the served model's tokenizer"),
    ],
)
def eval_(ctx: Context) -> int:
    from flows.gating import eval_sets_stage, eval_suites, evaluate_stage
    from flows.stages import open_registry

    args = ctx.args
    eval_suites(ctx.config)  # a bad suite name fails before anything loads

    def progress(result: SuiteResult) -> None:
        if not ctx.json:
            print(f"  {result.name}: done in {result.seconds:.1f}s", file=sys.stderr)

    if args.url:
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
            *suite_lines(report),
            f"  report      {path}",
        ],
    )
    return 0


@command(
    "parity",
    help="offline/online parity: a version's greedy answers from the serving side (a vLLM engine in "
    "serving.engine.dtype, or --url) against transformers' fp32 ones, same prompts and template (exit 3: differ)",
    example="lifecycle parity chat 2 --config configs/smollm2.yaml\n"
    "  lifecycle parity chat 2 --url http://127.0.0.1:3000/v1 --served-model chat --api-key KEY",
    args=[
        NAME,
        VERSION,
        Arg("--prompts", type=int, default=24, help="prompts to compare (default: 24)"),
        Arg("--max-tokens", type=int, default=24, help="greedy tokens per answer (default: 24)"),
        Arg("--min-rate", type=float, default=1.0, help="share of equal answers needed (default: 1.0, all)"),
        Arg("--url", help="compare an OpenAI-compatible endpoint (the gateway) instead of a local vLLM engine"),
        Arg("--served-model", metavar="NAME", default="chat", help="model name to request from --url"),
        Arg("--api-key", default="EMPTY", help="API key for --url"),
    ],
)
def parity(ctx: Context) -> int:
    from flows.gating import parity_stage

    args = ctx.args
    open_registry_check(ctx)
    url = (
        UrlTarget(label=args.url, base_url=args.url, model=args.served_model, api_key=args.api_key)
        if args.url
        else None
    )
    report = parity_stage(
        ctx.config, ctx.home, f"{args.name}/{args.version}", prompts=args.prompts, max_tokens=args.max_tokens, url=url
    )
    ctx.emit(
        report.to_json(),
        [
            f"parity {args.name}/{args.version}: {report.equal}/{report.compared} greedy answers equal "
            f"({report.rate:.2f}; online: {args.url or 'vLLM, serving.engine.dtype'})"
            + (
                f"; {len(report.filtered)} answered by the endpoint's safety filter, not compared"
                if report.filtered
                else ""
            ),
            *(
                f"  {m['prompt']!r}\n    offline {m['offline']!r}\n    online  {m['online']!r}"
                for m in report.mismatches[:5]
            ),
        ],
    )
    return 0 if report.rate >= args.min_rate else 3


def open_registry_check(ctx: Context) -> None:
    """A clear error for a version that does not exist, before any model loads."""
    from flows.stages import open_registry

    open_registry(ctx.config, ctx.home).get(ctx.args.name, ctx.args.version)


@command(
    "gate",
    help="evaluate a version and its champion, decide the promotion gate, record it in MLflow (exit 3: failed)",
    example="lifecycle gate chat 3\n  lifecycle gate chat 3 --set evals.gate=configs/gates/tiny.yaml --force",
    args=[NAME, VERSION, FORCE],
)
def gate(ctx: Context) -> int:
    from flows.gating import gate_policy
    from flows.stages import open_registry

    gate_policy(ctx.config)
    open_registry(ctx.config, ctx.home).get(ctx.args.name, ctx.args.version)
    from flows.evaluate import evaluate_flow

    summary = evaluate_flow(ctx.config, ctx.home, f"{ctx.args.name}/{ctx.args.version}", ctx.args.force)
    ctx.emit(asdict(summary), ["", "lifecycle gate: done", *gate_lines(summary)])
    return 0 if summary.passed else 3


@command(
    "quantize",
    help="quantize a registered version (quantize.scheme: W8A8 int8 or W4A16, compressed-tensors, served by vLLM's "
    "CPU kernels in bf16) and register it as a new chat version whose lineage names its parent and the method; "
    "then lifecycle gate judges it against that parent on the same items",
    example="lifecycle quantize chat 3\n"
    "  lifecycle quantize chat-base 1 --snapshot 58434b85 --config configs/smollm2.yaml\n"
    "  lifecycle quantize chat 3 --set quantize.scheme=W4A16 --set quantize.group_size=64",
    args=[
        NAME,
        VERSION,
        Arg("--snapshot", metavar="HASH", help="eval data for a parent without lineage.snapshot (an imported base)"),
    ],
)
def quantize(ctx: Context) -> int:
    from flows.quantization import quantize_stage

    open_registry_check(ctx)
    mv = quantize_stage(
        ctx.config, ctx.home, f"{ctx.args.name}/{ctx.args.version}", snapshot=ctx.args.snapshot, flow_run_id="cli"
    )
    lineage = mv.lineage
    ctx.emit(
        {"ref": mv.ref, "lineage": lineage},
        [
            f"quantized {lineage['parent']} -> {mv.ref}  method {lineage['method']}",
            f"  weights hash {lineage['weights_hash']}",
            f"  next: lifecycle gate {mv.name} {mv.version}   (judged against {lineage['parent']})",
        ],
    )
    return 0
