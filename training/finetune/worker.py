"""One rank of a DeepSpeed fine-tune. Started by a launcher (torchrun or ``deepspeed``), never imported by it:

    python -m torch.distributed.run --nproc_per_node 2 -m training.finetune.worker RUN_DIR/job.json

``training/finetune/launch.py`` writes the job (``training.finetune.job.RankJob``), launches the ranks and reads
back rank 0's ``TrainReport``.

A rank runs in three parts. :func:`setup` joins the process group (gloo on CPU, NCCL on its own GPU), encodes the
snapshot for its objective (``training/finetune/objectives.py``: SFT with the loss on assistant tokens only, or DPO
on preference pairs), wraps the model (``training/finetune/policy.py``: LoRA via peft, or full) in
``deepspeed.initialize`` with torch AdamW and a warm-up + cosine schedule, and resumes from the run's committed
checkpoint if there is one (``training/finetune/checkpoint.py``). :func:`run_steps` trains on the rank's shard of a
seeded, epoch-wise shuffled order (``training/finetune/order.py``), batches collated ahead on a thread, the loss kept
on the device between log points, a checkpoint every ``checkpoint_every`` steps (a killed and restarted run ends
with the same weights as an uninterrupted one). :func:`finish` has rank 0 export a Hugging Face folder (full
weights, or the adapter), reload it fresh and compare logits with the training model
(``training/finetune/export.py``) before it writes the report.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from tqdm import tqdm

from core.process import exit_with_parent
from training.config import FinetuneConfig
from training.finetune import checkpoint, faults
from training.finetune.collectives import Collectives
from training.finetune.export import consolidated_state, equivalence, export, export_hash
from training.finetune.job import RESULT, RankJob, TrainReport
from training.finetune.objectives import Dpo, Objective, Sft
from training.finetune.order import Order
from training.finetune.policy import build_model
from training.finetune.prefetch import Prefetcher
from training.finetune.runlock import hold_as_rank
from training.model.lr_schedule import warmup_cosine

log = logging.getLogger("lifecycle.train")
METRICS = "metrics.jsonl"


def lr_scheduler(cfg: FinetuneConfig, total: int) -> Any:
    """A LambdaLR factory (DeepSpeed calls it with the optimizer it wraps)."""
    return lambda optimizer: torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: warmup_cosine(step, cfg.warmup_steps, total)
    )


def _setup_logging(run_dir: Path, rank: int) -> None:
    (run_dir / "logs").mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(run_dir / "logs" / f"rank{rank}.log")
    handler.setFormatter(logging.Formatter(f"%(asctime)s rank{rank} %(levelname)s %(message)s"))
    log.addHandler(handler)
    log.setLevel(logging.INFO)


def _without_inference_comm_op() -> None:
    """DeepSpeed's CPU backend compiles its shared-memory all-reduce kernel (``deepspeed_shm_comm``) when it starts:
    90 s of g++ per machine and op cache, measured here on a fresh home (a third of a default fine-tune), for a
    kernel that only ``inference_all_reduce`` (tensor-parallel inference) calls, never training. Marked unavailable
    in DeepSpeed's table of compatible ops (kept in one dict for this purpose), the backend skips the build and
    that call falls back to torch.distributed's all-reduce, as it does wherever the op cannot be built."""
    import deepspeed.ops

    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False


def _optimizer(cfg: FinetuneConfig, params: list[torch.nn.Parameter], device: torch.device) -> torch.optim.Optimizer:
    """torch AdamW, fused into one kernel per step on CUDA (the for-each version launches several per tensor)."""
    fused = device.type == "cuda"
    return torch.optim.AdamW(
        params, lr=cfg.learning_rate, weight_decay=cfg.weight_decay, betas=(0.9, 0.95), fused=fused or None
    )


@dataclass
class Window:
    """The training loss and throughput between two log points, kept on the device until they are logged: the
    loop adds each micro-step's loss without reading it back (a host sync per step would idle the GPU)."""

    loss: torch.Tensor | None = None
    steps: int = 0
    tokens: int = 0
    since: float = field(default_factory=time.perf_counter)

    def add(self, loss: torch.Tensor, weight: float) -> None:
        part = loss.detach().to(torch.float64) * weight
        self.loss = part if self.loss is None else self.loss + part

    def close(self, comm: Collectives, world: int) -> tuple[float, float]:
        """The rank-averaged mean loss per step and the window's tokens per second (every rank's tokens); starts
        the next window. The collective is the window's one host sync, so the clock includes all its GPU work."""
        loss = comm.mean(self.loss if self.loss is not None else 0.0, float(self.steps))
        seconds = time.perf_counter() - self.since
        rate = self.tokens * world / seconds if seconds > 0 else 0.0
        self.loss, self.steps, self.tokens, self.since = None, 0, 0, time.perf_counter()
        return loss, rate


def _objective(job: RankJob, tok: Any, rank: int, world: int, comm: Collectives) -> Objective:
    snapshot = Path(job.snapshot_path)
    if job.objective is not None:
        return Dpo(job.config, job.objective, tok, snapshot, job.run_path, rank, world, comm)
    return Sft(job.config, tok, snapshot, rank, world)


@dataclass
class Rank:
    """A set-up rank: its place in the group, its device and collectives, its data and its DeepSpeed engine."""

    job: RankJob
    rank: int
    world: int
    device: torch.device
    backend: str
    comm: Collectives
    objective: Objective
    order: Order
    total: int  # optimizer steps of the whole run
    engine: Any  # deepspeed.DeepSpeedEngine
    stage: int  # ZeRO stage
    compiled: bool
    start: int  # the step this start resumes from (0: a fresh run)
    started: float = field(default_factory=time.perf_counter)

    @property
    def cfg(self) -> FinetuneConfig:
        return self.job.config

    def validate(self) -> dict[str, float]:
        # eagerly, also when compiled: a few validation batches a run are not worth compiling an inference graph
        with torch.compiler.set_stance("force_eager") if self.compiled else contextlib.nullcontext():
            return self.objective.validate(self.engine, self.comm)


@dataclass
class Trained:
    """What the step loop leaves for the report."""

    tokens: int  # this rank's attended tokens
    seconds: float  # the optimizer loop alone (validation excluded)
    loss: float  # the last logged, rank-averaged training loss
    val_curve: list[dict[str, float]]


def setup(job: RankJob) -> Rank:
    import deepspeed
    from transformers import AutoTokenizer

    cfg = job.config
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    _setup_logging(job.run_path, rank)
    torch.set_num_threads(job.threads_per_rank)
    cuda = torch.cuda.is_available()
    backend = cfg.distributed.backend if cfg.distributed.backend != "auto" else ("nccl" if cuda else "gloo")
    if not cuda:
        _without_inference_comm_op()
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    started = time.perf_counter()
    deepspeed.init_distributed(dist_backend=backend)
    comm = Collectives(device)

    tok = AutoTokenizer.from_pretrained(job.base_model)
    objective = _objective(job, tok, rank, world, comm)
    per_step = cfg.micro_batch_size * cfg.grad_accum_steps
    lengths = objective.lengths if cfg.group_by_length else None
    order = Order(objective.size, world, rank, cfg.seed, per_step, lengths)
    if order.steps_per_epoch < 1:
        raise ValueError(f"{objective.size} training items are too few for {world} ranks x {per_step} per step")
    total = min(cfg.max_steps or 10**12, cfg.epochs * order.steps_per_epoch)

    model = build_model(cfg, job.base_model)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = None if "optimizer" in job.deepspeed else _optimizer(cfg, params, device)
    engine, _, _, _ = deepspeed.initialize(
        model=model,
        model_parameters=params,
        optimizer=optimizer,
        lr_scheduler=lr_scheduler(cfg, total),
        config=dict(job.deepspeed),
    )
    compiled = cfg.compile and cuda
    if compiled:
        engine.compile()
    stage = int(job.deepspeed.get("zero_optimization", {}).get("stage", 0))
    start = checkpoint.resume(engine, job.run_path / "checkpoints", rank)
    log.info(
        "world=%d backend=%s device=%s zero=%d compiled=%s steps=%d/%d objective=%s items=%d (truncated %d, "
        "skipped %d)",
        world,
        backend,
        device,
        stage,
        compiled,
        start,
        total,
        type(objective).__name__,
        objective.size,
        objective.counts["truncated"],
        objective.counts["skipped"],
    )
    return Rank(
        job, rank, world, device, backend, comm, objective, order, total, engine, stage, compiled, start, started
    )


def run_steps(r: Rank) -> Trained:
    """The optimizer loop from ``r.start`` to the end: log windows, validation, checkpoints (and their faults)."""
    cfg, engine = r.cfg, r.engine
    metrics_file = (r.job.run_path / METRICS).open("a", encoding="utf-8") if r.rank == 0 else None
    val_curve = [] if r.start else [{"step": 0, **r.validate()}]
    bar = tqdm(
        total=r.total,
        initial=r.start,
        desc=f"fine-tune ({cfg.method}, {r.world} ranks)",
        unit="step",
        disable=r.rank != 0,
        mininterval=1.0,
        file=sys.stderr,
    )
    mbs, accum = cfg.micro_batch_size, cfg.grad_accum_steps
    batches = Prefetcher(
        lambda step, m: r.objective.batch(r.order.step(step)[m * mbs : (m + 1) * mbs]),
        range(r.start, r.total),
        micro_steps=accum,
        device=r.device,
    )
    tokens, t0, loss_value, eval_seconds, checkpoints = 0, time.perf_counter(), float("nan"), 0.0, 0
    window = Window()
    for step, micro, batch, batch_tokens in batches:
        loss = r.objective.loss(engine, batch)
        engine.backward(loss)
        engine.step()
        window.add(loss, 1.0 / accum)
        tokens += batch_tokens
        window.tokens += batch_tokens
        if micro + 1 < accum:
            continue
        window.steps += 1
        bar.update(1)
        last = step + 1 == r.total
        # bookkeeping every log_every steps, not every step: a collective, a host sync and a file write per step
        # cost several percent of a small model's step time
        evaluate = (step + 1) % cfg.eval_every == 0 or last
        if (step + 1) % cfg.log_every == 0 or evaluate:
            loss_value, rate = window.close(r.comm, r.world)
            row: dict[str, Any] = {"step": step + 1, "loss": loss_value, "lr": engine.get_lr()[0], "tokens_per_s": rate}
            if evaluate:
                t_eval = time.perf_counter()
                row.update(r.validate())
                val_curve.append({k: v for k, v in row.items() if k == "step" or k.startswith("val_")})
                eval_seconds += time.perf_counter() - t_eval
                window.since = time.perf_counter()  # the next window measures training alone
            if metrics_file:
                metrics_file.write(json.dumps(row) + "\n")
                metrics_file.flush()
            bar.set_postfix(loss=f"{loss_value:.3f}", tok_s=f"{rate:,.0f}", refresh=False)
        if (step + 1) % cfg.checkpoint_every == 0 and not last:
            checkpoint.save(engine, r.job.run_path / "checkpoints", step + 1, r.rank, cfg.keep_checkpoints, r.comm)
            checkpoints += 1
            faults.after_checkpoint(r.job.run_path, r.rank, step + 1, first=checkpoints == 1)
    batches.close()
    bar.close()
    if metrics_file:
        metrics_file.close()
    return Trained(tokens, time.perf_counter() - t0 - eval_seconds, loss_value, val_curve)


def finish(r: Rank, trained: Trained) -> None:
    """Every rank: the token count and the gathered state; rank 0: the export, its check and the report."""
    cfg = r.cfg
    all_tokens = int(r.comm.sum(torch.tensor([float(trained.tokens)]))[0])
    peak_memory = torch.cuda.max_memory_allocated(r.device) if r.device.type == "cuda" else None  # before export
    state = consolidated_state(r.engine, r.stage, r.job.run_path, r.rank, r.comm)
    if r.rank == 0:
        assert state is not None
        out = r.job.run_path / "export"
        if out.exists():
            shutil.rmtree(out)
        exported = export(cfg, r.job, state, out)
        check = equivalence(cfg, r.job, exported, out, r.objective.check_batch())
        first, final = (trained.val_curve[0], trained.val_curve[-1]) if trained.val_curve else ({}, {})
        seconds = trained.seconds
        report = TrainReport(
            method=cfg.method,
            export_dir=str(out),
            weights_hash=export_hash(cfg, out),
            steps=r.total,
            resumed_from_step=r.start,
            world_size=r.world,
            backend=r.backend,
            device=r.device.type,
            compiled=r.compiled,
            zero_stage=r.stage,
            deepspeed_config=r.job.deepspeed,
            objective="dpo" if isinstance(r.objective, Dpo) else "sft",
            train_examples=r.objective.size,
            truncated=r.objective.counts["truncated"],
            skipped=r.objective.counts["skipped"],
            metrics={
                **{f"{k}_initial": v for k, v in first.items() if k.startswith("val_")},
                **{k: v for k, v in final.items() if k.startswith("val_")},
                "train_loss": trained.loss,
                "val_loss_initial": first.get("val_loss"),
                "val_loss": final.get("val_loss"),
                "tokens_per_s": all_tokens / seconds if seconds > 0 else 0.0,
                "train_tokens": all_tokens,
                "train_seconds": seconds,
                "peak_memory_bytes": peak_memory,
            },
            equivalence=check,
            seconds=time.perf_counter() - r.started,
        )
        report.write(r.job.run_path / RESULT)
        log.info("export %s equivalence %s", out, check.model_dump())
    r.comm.barrier()


def train(job: RankJob) -> None:
    r = setup(job)
    finish(r, run_steps(r))
    dist.destroy_process_group()


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m training.finetune.worker RUN_DIR/job.json", file=sys.stderr)
        return 2
    job = RankJob.read(Path(argv[0]))
    faults.active()  # an unknown fault name fails here, before the rank holds anything
    hold_as_rank(job.run_path)  # held until this rank exits, however it exits (training.finetune.runlock)
    # launchers start ranks in sessions of their own (torchrun) or in theirs (deepspeed's): a rank whose launcher
    # died stops at once instead of training on; it takes its own group down only when it leads it
    exit_with_parent(children_too=False, whole_group=os.getpgrp() == os.getpid())
    train(job)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
