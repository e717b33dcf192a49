"""Training throughput: our DeepSpeed path against a plain PyTorch loop, and 2 ranks against 1, in one run.

    .venv/bin/python benchmarks/train_throughput.py                      # default config (bootstraps if needed)
    .venv/bin/python benchmarks/train_throughput.py --set finetune.packing=true --steps 40 --repeats 5

All three runs train the same model (the configured base model and method) on the same snapshot with the same
micro-batch, optimizer and schedule, for the same number of optimizer steps; tokens/s counts non-padding tokens
over the optimizer loop only (start-up, evaluation and export excluded). The plain loop runs in this process
with all cores; each DeepSpeed run is launched like ``lifecycle train`` (torchrun, gloo on CPU), with the cores
split between its ranks. Target: DeepSpeed at 1 rank >= 0.95x the plain loop.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def plain_loop(cfg, snapshot, base, steps: int) -> dict[str, float]:  # type: ignore[no-untyped-def]
    """The baseline: the same model, data order and optimizer as one rank of the worker, without DeepSpeed."""
    import torch
    from transformers import AutoTokenizer

    from training.finetune.objectives import records as _records
    from training.finetune.order import Order
    from training.finetune.policy import build_model
    from training.finetune.sft_data import collate, encode, pack
    from training.finetune.worker import lr_scheduler

    torch.set_num_threads(os.cpu_count() or 1)
    tok = AutoTokenizer.from_pretrained(str(base.path))
    examples = encode(_records(snapshot.split_path("train")), tok, cfg.max_seq_len).examples
    if cfg.packing:
        examples = pack(examples, cfg.max_seq_len)
    model = build_model(cfg, str(base.path))
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=cfg.learning_rate, weight_decay=cfg.weight_decay, betas=(0.9, 0.95))
    scheduler = lr_scheduler(cfg, steps)(optimizer)
    order = Order(len(examples), 1, 0, cfg.seed, cfg.micro_batch_size * cfg.grad_accum_steps)
    tokens, t0 = 0, time.perf_counter()
    for step in range(steps):
        idx = order.step(step)
        for m in range(cfg.grad_accum_steps):
            part = idx[m * cfg.micro_batch_size : (m + 1) * cfg.micro_batch_size]
            batch = collate([examples[i] for i in part], tok.pad_token_id)
            tokens += int(batch["attention_mask"].sum())
            loss = model(**batch).loss / cfg.grad_accum_steps
            loss.backward()
        torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
    seconds = time.perf_counter() - t0
    return {"tokens_per_s": tokens / seconds, "train_tokens": tokens, "train_seconds": seconds}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default=str(REPO / "configs" / "default.yaml"))
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--steps", type=int, default=100, help="optimizer steps per run")
    parser.add_argument("--repeats", type=int, default=3, help="interleaved repeats of the three runs")
    parser.add_argument("--home", help="state folder (default: $LIFECYCLE_HOME or ./.lifecycle)")
    args = parser.parse_args()

    from core import runtime
    from flows.config import load_config
    from flows.stages import base_model_stage, snapshot_stage

    cfg = load_config(Path(args.config), args.set)
    home = cfg.resolve_home(args.home)
    runtime.configure(home)
    from training.finetune.launch import finetune

    snapshot = snapshot_stage(cfg, home)
    base = base_model_stage(cfg, home, snapshot)
    names = ["plain PyTorch loop, 1 process", "DeepSpeed, 1 rank", "DeepSpeed, 2 ranks"]
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in names}
    stage = "?"
    with tempfile.TemporaryDirectory(dir=home.tmp()) as tmp:
        # interleaved repeats: this machine's speed drifts by +-10% between minutes, so each repeat measures
        # all three side by side and the medians are compared
        for rep in range(args.repeats):
            runs[names[0]].append(plain_loop(cfg.finetune, snapshot, base, args.steps))
            for world, name in ((1, names[1]), (2, names[2])):
                ft = cfg.finetune.model_copy(
                    update={
                        "max_steps": args.steps,
                        "eval_every": 10**9,
                        "checkpoint_every": 10**9,
                        "eval_batches": 1,
                        "log_every": 10**9,
                        "distributed": cfg.finetune.distributed.model_copy(update={"world_size": world}),
                    }
                )
                report = finetune(ft, snapshot, base, Path(tmp) / f"rep{rep}-ranks{world}").report
                stage = str(report.zero_stage)
                runs[name].append(dict(report.metrics))

    ordered = {name: [r["tokens_per_s"] for r in rs] for name, rs in runs.items()}
    paired = [d / p for d, p in zip(ordered[names[1]], ordered[names[0]], strict=True)]  # same repeat, side by side
    rates = {name: sorted(values) for name, values in ordered.items()}
    plain, ds1, ds2 = (statistics.median(rates[n]) for n in names)
    print(
        f"\ntraining throughput: {cfg.finetune.method}, ZeRO-{stage}, {args.steps} steps of "
        f"{cfg.finetune.micro_batch_size} sequences per rank (packing {cfg.finetune.packing}), "
        f"base {base.path.name}, {os.cpu_count()} cores, {args.repeats} interleaved repeats"
    )
    for name in names:
        r = rates[name]
        print(f"  {name:<32} median {statistics.median(r):>8,.0f} tokens/s   (min {r[0]:,.0f}, max {r[-1]:,.0f})")
    print(
        f"  ratio DeepSpeed 1 rank / plain loop   {ds1 / plain:.3f}  (target >= 0.95; per repeat: "
        + ", ".join(f"{r:.3f}" for r in paired)
        + f"; median {statistics.median(paired):.3f})"
    )
    print(f"  ratio DeepSpeed 2 ranks / 1 rank      {ds2 / ds1:.3f}")
    print(
        json.dumps(
            {
                "plain": plain,
                "deepspeed_1": ds1,
                "deepspeed_2": ds2,
                "ratio_ds1_plain": ds1 / plain,
                "ratio_ds2_ds1": ds2 / ds1,
                "runs": rates,
            }
        )
    )
    return 0 if math.isfinite(ds1) else 1


if __name__ == "__main__":
    sys.exit(main())
