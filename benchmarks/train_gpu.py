"""GPU training throughput: a plain PyTorch loop against our DeepSpeed worker (ZeRO-1, -2, -3; SFT and DPO), in one
run, on a 405 M-parameter Llama.

    python benchmarks/train_gpu.py                     # on a CUDA machine (about 8 min on one H100)
    python benchmarks/train_gpu.py --only plain-sft,zero2-sft --steps 40 --json out.json
    python benchmarks/train_gpu.py --dry-run           # the same code paths on a tiny model, CPU allowed (no ratios)

Model: Llama, hidden 1024, 24 layers, 16 heads, MLP 4096, tied embeddings, over the project tokenizer's 2048-token
vocabulary (404.7 M parameters), randomly initialised (``training.workbench``). Data: the default config's chat
snapshot, packed into 1024-token sequences, 16 sequences a step (SFT); its generated preference pairs, 16 pairs (32
sequences, up to 256 tokens) a step (DPO). Every trainer gets the same batches (the worker's seeded order, collated
ahead on a thread: ``training.finetune.prefetch``), AdamW (betas 0.9/0.95), the warm-up + cosine schedule and clipping
at 1.0.

- plain loop: bf16 autocast over fp32 weights, fused AdamW, SDPA attention (transformers' default), no host sync
  between log points; in this process.
- worker: ``training.finetune.launch.finetune`` (torchrun, one rank, NCCL), DeepSpeed bf16 (bf16 weights, fp32 master
  weights and optimizer state), fused AdamW, ZeRO stage 1, 2 or 3; a subprocess tree of this process.
- ``+compile``: the same with ``torch.compile`` (the worker's ``finetune.compile``).

Reported per trainer: tokens/s (attended tokens, padding excluded; the median of the log windows after the
warm-up steps, so start-up, compilation, evaluation and export are excluded), model TFLOP/s = 6 x parameters x
tokens/s (attention's own FLOPs not counted, as in the usual 6N convention), MFU against a bf16 matmul peak
measured at the start of the run (8192^3, mean of 10 after warm-up), peak GPU memory, and the ratio to the plain
loop of the same objective. Targets (issue 24): worker >= 0.95x the plain loop at ZeRO-1/2; >= 250 model TFLOP/s.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import traceback
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from training.config import DistributedConfig, FinetuneConfig, ModelShape  # noqa: E402
from training.workbench import Workbench  # noqa: E402

SHAPE = ModelShape(
    hidden_size=1024, intermediate_size=4096, num_layers=24, num_heads=16, num_kv_heads=16, max_position_embeddings=1024
)
TINY = ModelShape(hidden_size=64, intermediate_size=128, num_layers=2, num_heads=2, num_kv_heads=2)
ZERO = {1: "infra/deepspeed/zero1.json", 2: "infra/deepspeed/zero2.json", 3: "infra/deepspeed/zero3-bf16.json"}
TRAINERS = (  # in the order they run: the eager SFT rows first
    "plain-sft",
    "zero2-sft",
    "zero1-sft",
    "zero3-sft",
    "plain-dpo",
    "zero2-dpo",
    "plain-sft+compile",
    "zero2-sft+compile",
    "zero1-sft+compile",
    "default-sft-cpu2",  # the default config's 1.3 M model as it trains on 2 CPU ranks (this machine's CPU) ...
    "default-sft-gpu",  # ... and on one GPU, the same config otherwise: its ratio is against the CPU row
)


@dataclass
class Row:
    trainer: str
    objective: str
    tokens_per_s: float
    tflops: float
    mfu: float
    peak_memory_gb: float | None
    windows: int
    ratio: float | None = None
    note: str = ""


def matmul_peak(device: torch.device) -> float:
    """bf16 TFLOP/s of an 8192^3 matrix product on this GPU: the MFU denominator, measured, not looked up."""
    n = 8192
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(10):
        a @ b
    end.record()
    torch.cuda.synchronize()
    return 2 * n**3 * 10 / (start.elapsed_time(end) / 1000) / 1e12


def config(args: argparse.Namespace, *, objective: str, stage: int = 2, compile: bool = False) -> FinetuneConfig:
    sft = objective == "sft"
    return FinetuneConfig(
        method="full",
        bf16=torch.cuda.is_available(),  # the dry run's CPU ranks train in fp32
        compile=compile,
        deepspeed_config=ZERO[stage],
        epochs=10_000,  # steps, not epochs, end the run
        max_steps=args.steps,
        micro_batch_size=16,
        max_seq_len=1024 if sft else 256,
        packing=sft,
        group_by_length=False,
        learning_rate=3e-4 if sft else 1e-5,
        warmup_steps=5,
        log_every=args.log_every,
        eval_every=args.steps,  # one validation at the end (and the one at step 0)
        eval_batches=1,
        checkpoint_every=10**6,
        distributed=DistributedConfig(world_size=1),
    )


def steady(rates: list[float]) -> float:
    return statistics.median(rates) if rates else 0.0


def plain_loop(cfg: FinetuneConfig, bench: Workbench, model_dir: Path, run_dir: Path, dpo: bool) -> dict[str, Any]:
    """The baseline: one process, no DeepSpeed, the same objective, batches, optimizer and schedule as a rank."""
    import torch.distributed as dist
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from training.finetune.collectives import Collectives
    from training.finetune.launch import DpoSpec
    from training.finetune.objectives import Dpo, Objective, Sft
    from training.finetune.order import Order
    from training.finetune.prefetch import Prefetcher
    from training.finetune.worker import Window, lr_scheduler
    from training.model.modelio import inspect_model_folder

    cuda = torch.cuda.is_available()
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    if not dist.is_initialized():  # the objectives' reductions (a world of one)
        dist.init_process_group(
            "nccl" if cuda else "gloo", init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1
        )
    comm = Collectives(device)
    tok = AutoTokenizer.from_pretrained(model_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    snapshot = bench.pair_snapshot() if dpo else bench.chat_snapshot()
    objective: Objective
    if dpo:
        spec = DpoSpec(beta=0.1, sft_weight=1.0, reference=inspect_model_folder(model_dir)).job()
        objective = Dpo(cfg, spec, tok, snapshot.path, run_dir, 0, 1, comm)
    else:
        objective = Sft(cfg, tok, snapshot.path, 0, 1)
    steps = cfg.max_steps or 1
    order = Order(objective.size, 1, 0, cfg.seed, cfg.micro_batch_size)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).to(device)
    model.train()
    if cfg.compile and cuda:  # as the worker: compiled on CUDA only
        model.compile()
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(
        params, lr=cfg.learning_rate, weight_decay=cfg.weight_decay, betas=(0.9, 0.95), fused=cuda or None
    )
    scheduler = lr_scheduler(cfg, steps)(optimizer)
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
    batches = Prefetcher(lambda step, m: objective.batch(order.step(step)), range(steps), micro_steps=1, device=device)
    window, rates, losses = Window(), [], []
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=cuda)
    for step, _, batch, tokens in batches:
        with autocast:
            loss = objective.loss(model, batch)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        window.add(loss, 1.0)
        window.steps += 1
        window.tokens += tokens
        if (step + 1) % cfg.log_every == 0:
            mean_loss, rate = window.close(comm, 1)
            losses.append(mean_loss)
            if step + 1 > warm_up_steps(cfg):
                rates.append(rate)
    batches.close()
    peak = torch.cuda.max_memory_allocated(device) if cuda else None
    del model, optimizer
    if cuda:
        torch.cuda.empty_cache()
    return {"rates": rates, "losses": losses, "peak": peak}


def warm_up_steps(cfg: FinetuneConfig) -> int:
    """Steps left out of the steady state: compilation and the allocator's first steps happen there."""
    return max(cfg.log_every, min(10, (cfg.max_steps or 0) // 3))


def worker(cfg: FinetuneConfig, bench: Workbench, model_dir: Path, run_dir: Path, dpo: bool) -> dict[str, Any]:
    from training.finetune.launch import DpoSpec, finetune
    from training.model.modelio import inspect_model_folder

    base = inspect_model_folder(model_dir)
    spec = DpoSpec(beta=0.1, sft_weight=1.0, reference=base) if dpo else None
    snapshot = bench.pair_snapshot() if dpo else bench.chat_snapshot()
    result = finetune(cfg, snapshot, base, run_dir, spec)
    curve = result.curve()
    rates = [r["tokens_per_s"] for r in curve if r["step"] > warm_up_steps(cfg)]
    return {
        "rates": rates,
        "losses": [r["loss"] for r in curve],
        "peak": result.metrics.get("peak_memory_bytes"),
        "equivalence": result.equivalence,
        "seconds": result.report.seconds,
    }


def ratios(rows: list[Row]) -> None:
    """Each row against its baseline measured in this run: the plain loop of its objective (the compiled plain
    loop for a compiled row, where measured); the default model on one GPU against it on 2 CPU ranks."""
    by_name = {r.trainer: r for r in rows}
    for row in rows:
        if row.trainer.startswith("default-"):
            base = by_name.get("default-sft-cpu2")
        elif row.trainer.endswith("+compile"):
            base = by_name.get(f"plain-{row.objective}+compile") or by_name.get(f"plain-{row.objective}")
        else:
            base = by_name.get(f"plain-{row.objective}")
        row.ratio = row.tokens_per_s / base.tokens_per_s if base and base.tokens_per_s else None


def parameters(model_dir: Path) -> int:
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_dir))
    return sum(p.numel() for p in skeleton.parameters())


def write(path: Path | None, card: str, peak: float, params: int, rows: list[Row]) -> None:
    if path is not None:
        report = {"card": card, "peak_tflops": peak, "params": params, "rows": [asdict(r) for r in rows]}
        path.write_text(json.dumps(report, indent=2) + "\n")


def _free_port() -> int:
    from core.process import free_port

    return free_port()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=30, help="optimizer steps per trainer (default 30)")
    parser.add_argument("--log-every", type=int, default=5, help="steps per measured window (default 5)")
    parser.add_argument("--only", default=",".join(TRAINERS), help=f"comma-separated subset of {', '.join(TRAINERS)}")
    parser.add_argument("--json", type=Path, default=None, help="write the rows here too")
    parser.add_argument("--root", type=Path, default=None, help="work folder (default: a temporary one)")
    parser.add_argument("--dry-run", action="store_true", help="tiny model, 6 steps, any device: the code paths only")
    args = parser.parse_args()
    only = [t.strip() for t in args.only.split(",") if t.strip()]
    unknown = sorted(set(only) - set(TRAINERS))
    if unknown:
        parser.error(f"unknown trainer(s) {', '.join(unknown)} (choose from {', '.join(TRAINERS)})")
    if args.dry_run:
        args.steps, args.log_every = 6, 2
    elif not torch.cuda.is_available():
        print("train_gpu: needs a CUDA device (--dry-run runs the code paths on CPU)", file=sys.stderr)
        return 2
    root = args.root or Path(tempfile.mkdtemp(prefix="train-gpu-"))
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    # the default config's data (its tokenizer has the full 2048 tokens); the bootstrap model only lends the
    # tokenizer and chat template to the wide one, so it trains a few steps
    bench = Workbench.from_yaml(REPO / "configs" / "default.yaml", root / "home", ["bootstrap.pretrain.steps=20"])
    shape = TINY if args.dry_run else SHAPE
    model_dir = bench.wide_model(shape).path
    params = parameters(model_dir)
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    peak = matmul_peak(device) if cuda else float("nan")
    card = torch.cuda.get_device_name(0) if cuda else "cpu"
    print(
        f"train_gpu: {card}, torch {torch.__version__}, model {params / 1e6:.1f} M parameters, "
        f"bf16 matmul peak {peak:.0f} TFLOP/s, {args.steps} steps, windows of {args.log_every}",
        flush=True,
    )

    rows: list[Row] = []
    for name in only:
        trainer, objective = name.split("-")[0], name.split("-")[1].split("+")[0]
        run = root / "runs" / name.replace("+", "-")
        started = time.perf_counter()
        hidden = os.environ.get("CUDA_VISIBLE_DEVICES")
        try:
            if trainer == "default":  # the default config's fine-tune on its model's shape: CPU ranks or one GPU
                on_gpu = name.endswith("-gpu")
                cfg = bench.finetune.model_copy(
                    update={
                        "max_steps": max(args.steps, 60),
                        "log_every": 10,
                        "eval_every": 10**6,
                        "checkpoint_every": 10**6,
                        "distributed": bench.finetune.distributed.model_copy(
                            update={"world_size": 1 if on_gpu else 2, "threads_per_rank": None if on_gpu else 1}
                        ),
                    }
                )
                if not on_gpu:
                    os.environ["CUDA_VISIBLE_DEVICES"] = ""  # the ranks see no GPU: gloo on 2 CPU ranks
                small = bench.wide_model(bench.bootstrap.model).path
                row_params = parameters(small)
                out = worker(cfg, bench, small, run, False)
            else:
                stage = int(trainer.removeprefix("zero")) if trainer.startswith("zero") else 2
                cfg = config(args, objective=objective, stage=stage, compile=name.endswith("+compile"))
                row_params = params
                out = (plain_loop if trainer == "plain" else worker)(cfg, bench, model_dir, run, objective == "dpo")
        except Exception:  # one trainer's failure is reported, the others still run
            traceback.print_exc()
            print(f"train_gpu: {name} FAILED", flush=True)
            continue
        finally:
            if hidden is None:
                os.environ.pop("CUDA_VISIBLE_DEVICES", None)
            else:
                os.environ["CUDA_VISIBLE_DEVICES"] = hidden
        rate = steady(out["rates"])
        tflops = 6 * row_params * rate / 1e12
        row = Row(
            trainer=name,
            objective=objective,
            tokens_per_s=rate,
            tflops=tflops,
            mfu=tflops / peak if cuda else float("nan"),
            peak_memory_gb=out["peak"] / 2**30 if out["peak"] else None,
            windows=len(out["rates"]),
            note=f"{time.perf_counter() - started:.0f} s wall; loss {out['losses'][0]:.3f} -> {out['losses'][-1]:.3f}"
            + (f"; export diff {out['equivalence']['max_abs_logit_diff']:.3g}" if "equivalence" in out else ""),
        )
        rows.append(row)
        ratios(rows)
        print(f"  {name:<20} {rate:>10,.0f} tok/s {tflops:7.1f} TFLOP/s  MFU {row.mfu:6.1%}  {row.note}", flush=True)
        write(args.json, card, peak, params, rows)  # after every row: a run cut short keeps what it measured

    print(f"\n| trainer | tokens/s | model TFLOP/s (6N) | MFU vs {peak:.0f} | peak GiB | vs baseline |")
    print("|---|---|---|---|---|---|")
    for row in rows:
        ratio = f"{row.ratio:.2f}" if row.ratio is not None else "-"
        mem = f"{row.peak_memory_gb:.1f}" if row.peak_memory_gb is not None else "-"
        print(f"| {row.trainer} | {row.tokens_per_s:,.0f} | {row.tflops:.1f} | {row.mfu:.1%} | {mem} | {ratio} |")
    print(
        "(ratios: each row against its baseline in this run: the plain loop of its objective, the compiled one for a "
        "+compile row; default-sft-gpu against default-sft-cpu2)"
    )
    write(args.json, card, peak, params, rows)
    expected = len(only)
    return 0 if len(rows) == expected else 1


if __name__ == "__main__":
    sys.exit(main())
