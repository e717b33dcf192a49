"""One rank of a DeepSpeed fine-tune. Started by a launcher (torchrun or ``deepspeed``), never imported by it:

    python -m torch.distributed.run --nproc_per_node 2 -m training.worker RUN_DIR/job.json

``training/finetune.py`` writes the job file, launches the ranks and reads back ``train_result.json``.

What a rank does: joins the process group (gloo on CPU, NCCL on GPU), encodes the snapshot for its objective
(``training/objectives.py``: SFT with the loss on assistant tokens only, or DPO on preference pairs), wraps the
model (LoRA via peft, or full) in ``deepspeed.initialize`` with a torch AdamW and a warm-up + cosine schedule, and
trains on its shard of a seeded, epoch-wise shuffled order. Every ``checkpoint_every`` steps all ranks write a
DeepSpeed checkpoint plus each rank's RNG state; on start, a run that finds a checkpoint resumes from it, at the
exact sample where it stopped, so a killed and restarted run ends with the same weights as an uninterrupted one.
At the end rank 0 exports a Hugging Face folder (full weights, or the adapter), reloads it fresh and compares
logits with the training model before reporting.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import random
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from safetensors.torch import load_file
from torch.utils.data import DistributedSampler
from tqdm import tqdm

from core.process import exit_with_parent
from training.collectives import Collectives
from training.config import FinetuneConfig
from training.modelio import tensors_hash
from training.objectives import Dpo, Objective, Sft
from training.prefetch import Prefetcher
from training.runlock import hold_as_rank
from training.schedule import warmup_cosine

log = logging.getLogger("lifecycle.train")
RESULT = "train_result.json"
METRICS = "metrics.jsonl"
LATEST = "latest"  # the committed checkpoint's tag (DeepSpeed's load_checkpoint reads the same file)


GROUP_STEPS = 32  # group_by_length sorts runs of this many global steps of the seeded order by length


class _Order:
    """Which examples a rank sees at a given step: a DistributedSampler order per epoch (seeded, drop_last); with
    ``lengths``, grouped by length (``group_by_length``). Either is a pure function of (seed, epoch), so a resumed
    run sees the same batches as an uninterrupted one."""

    def __init__(
        self, n: int, world: int, rank: int, seed: int, per_step: int, lengths: list[int] | None = None
    ) -> None:
        # the sampler only needs len(): a range stands in for the dataset
        self.sampler: DistributedSampler[int] = DistributedSampler(
            range(n),  # type: ignore[arg-type]
            num_replicas=world,
            rank=rank,
            shuffle=True,
            seed=seed,
            drop_last=True,
        )
        self.n, self.world, self.rank, self.seed, self.per_step = n, world, rank, seed, per_step
        self.lengths = lengths
        self.steps_per_epoch = len(self.sampler) // per_step
        self._epoch = -1
        self._indices: list[int] = []

    def step(self, step: int) -> list[int]:
        epoch, within = divmod(step, self.steps_per_epoch)
        if epoch != self._epoch:
            self.sampler.set_epoch(epoch)
            self._indices = list(iter(self.sampler)) if self.lengths is None else self._grouped(epoch)
            self._epoch = epoch
        return self._indices[within * self.per_step : (within + 1) * self.per_step]

    def _grouped(self, epoch: int) -> list[int]:
        """The sampler's global order for the epoch, cut into runs of GROUP_STEPS global steps; each run sorted by
        length and cut into global steps (all ranks' examples of a step alike in length, so no rank waits on a
        longer batch); the steps shuffled; this rank's share of each."""
        g = torch.Generator()
        g.manual_seed(self.seed + epoch)  # DistributedSampler's own permutation
        per_global = self.per_step * self.world
        order = torch.randperm(self.n, generator=g).tolist()[: self.steps_per_epoch * per_global]
        assert self.lengths is not None
        lengths = self.lengths
        steps: list[list[int]] = []
        for start in range(0, len(order), per_global * GROUP_STEPS):
            run = sorted(order[start : start + per_global * GROUP_STEPS], key=lambda i: lengths[i])
            steps += [run[k : k + per_global] for k in range(0, len(run), per_global)]
        random.Random(self.seed + epoch).shuffle(steps)
        return [i for s in steps for i in s[self.rank :: self.world]]


def _schedule(cfg: FinetuneConfig, total: int) -> Any:
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


def _build_model(cfg: FinetuneConfig, base: str) -> Any:  # a transformers PreTrainedModel or a peft PeftModel
    from transformers import AutoModelForCausalLM

    torch.manual_seed(cfg.seed)  # the same adapter init on every rank
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    if cfg.activation_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.config.use_cache = False
    if cfg.method == "lora":
        from peft import LoraConfig, get_peft_model

        lora = LoraConfig(
            r=cfg.lora.r,
            lora_alpha=cfg.lora.alpha,
            lora_dropout=cfg.lora.dropout,
            target_modules=list(cfg.lora.target_modules),
            task_type="CAUSAL_LM",
        )
        return get_peft_model(model, lora)
    return model


def _checkpoint(engine: Any, ckpt_dir: Path, step: int, rank: int, keep: int, comm: Collectives) -> None:
    """Write a checkpoint and only then commit it: ``latest`` names a tag once every rank's files (DeepSpeed's and
    our RNG state) are on disk. DeepSpeed's own ``latest`` is written by rank 0 as soon as rank 0 is done, while
    other ranks may still be writing, and before our RNG files: a kill in between left a checkpoint that could
    not be resumed."""
    tag = f"step{step:07d}"
    engine.save_checkpoint(str(ckpt_dir), tag=tag, client_state={"step": step}, save_latest=False)
    torch.save({"torch": torch.get_rng_state()}, ckpt_dir / tag / f"rng_rank{rank}.pt")
    comm.barrier()
    if rank == 0:
        pending = ckpt_dir / "latest.tmp"
        pending.write_text(tag)
        os.replace(pending, ckpt_dir / LATEST)  # atomic: a reader sees the old tag or the new one
        for old in sorted(p for p in ckpt_dir.glob("step*") if p.is_dir())[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
    comm.barrier()
    log.info("checkpoint %s", tag)


def _resume(engine: Any, ckpt_dir: Path, rank: int) -> int:
    if not (ckpt_dir / LATEST).is_file():
        return 0
    path, client = engine.load_checkpoint(str(ckpt_dir))
    if path is None:
        return 0
    tag = (ckpt_dir / LATEST).read_text().strip()
    torch.set_rng_state(torch.load(ckpt_dir / tag / f"rng_rank{rank}.pt")["torch"])
    log.info("resumed from %s at step %d", tag, client["step"])
    return int(client["step"])


def _consolidated_state(
    engine: Any, stage: int, run_dir: Path, rank: int, comm: Collectives
) -> dict[str, torch.Tensor] | None:
    """The full state dict on rank 0 (every rank must call this: ZeRO-3 gathers the shards)."""
    if stage == 3:
        tmp = run_dir / "gathered"
        engine.save_16bit_model(str(tmp), "state.pt")
        comm.barrier()
        return torch.load(tmp / "state.pt", map_location="cpu") if rank == 0 else None
    return {k: v.detach().cpu() for k, v in engine.module.state_dict().items()} if rank == 0 else None


def _export(cfg: FinetuneConfig, job: dict[str, Any], state: dict[str, torch.Tensor], out: Path) -> torch.nn.Module:
    """Write the Hugging Face folder from ``state``; returns the model that holds exactly those weights.

    LoRA: the adapter is the artifact, applied by its user to the base model as it is on disk. Only the trained
    weights are taken from ``state``: the frozen base weights in it are the engine's copies, rounded to bf16 in a
    bf16 run (on the first GPU run the export check failed on that rounding alone, 0.03 in logits), and no user
    ever loads them."""
    from transformers import AutoTokenizer, GenerationConfig

    base = job["base_model"]
    model = _build_model(cfg, base)
    if cfg.method == "lora":
        trained = {name for name, p in model.named_parameters() if p.requires_grad}
        assert trained <= state.keys(), f"trained weights missing from the state: {sorted(trained - state.keys())[:5]}"
        state = {k: v for k, v in state.items() if k in trained}
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected, f"unexpected keys in consolidated state: {unexpected[:5]}"
    frozen = {name for name, p in model.named_parameters() if not p.requires_grad} if cfg.method == "lora" else set()
    assert all("lm_head" in k or k in frozen for k in missing), f"missing keys in consolidated state: {missing[:5]}"
    model.eval()
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(base).save_pretrained(out)
    if cfg.method == "lora":
        config = json.loads((out / "adapter_config.json").read_text())
        config["base_model_name_or_path"] = base
        (out / "adapter_config.json").write_text(json.dumps(config, indent=2))
    else:
        GenerationConfig.from_pretrained(base).save_pretrained(out)
    return model


def _equivalence(
    cfg: FinetuneConfig, job: dict[str, Any], trained: torch.nn.Module, out: Path, batch: dict[str, torch.Tensor]
) -> dict[str, Any]:
    """Load the export fresh, as a user would, and compare its logits with the training model's."""
    from transformers import AutoModelForCausalLM

    if cfg.method == "lora":
        from peft import PeftModel

        fresh: torch.nn.Module = PeftModel.from_pretrained(
            AutoModelForCausalLM.from_pretrained(job["base_model"]), str(out)
        )
    else:
        fresh = AutoModelForCausalLM.from_pretrained(str(out))
    fresh.eval()
    trained.eval()
    with torch.no_grad():
        a = trained(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        b = fresh(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    mask = batch["attention_mask"].bool()
    diff = float((a - b).abs()[mask].max())
    return {
        "max_abs_logit_diff": diff,
        "atol": cfg.equivalence_atol,
        "passed": diff <= cfg.equivalence_atol,
        "batch_shape": list(batch["input_ids"].shape),
    }


def _export_hash(cfg: FinetuneConfig, out: Path) -> str:
    name = "adapter_model.safetensors" if cfg.method == "lora" else "model.safetensors"
    return tensors_hash(load_file(out / name))


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


def _objective(
    cfg: FinetuneConfig, job: dict[str, Any], tok: Any, rank: int, world: int, comm: Collectives
) -> Objective:
    snapshot = Path(job["snapshot_path"])
    spec = job.get("objective")
    if spec and spec["kind"] == "dpo":
        return Dpo(cfg, spec, tok, snapshot, Path(job["run_dir"]), rank, world, comm)
    return Sft(cfg, tok, snapshot, rank, world)


@dataclass
class _Window:
    """The training loss and throughput between two log points, kept on the device until they are logged: the
    loop adds each micro-step's loss without reading it back (a host sync per step would idle the GPU)."""

    device: torch.device
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


def train(job: dict[str, Any]) -> None:
    import deepspeed
    from transformers import AutoTokenizer

    cfg = FinetuneConfig.model_validate(job["config"])
    run_dir = Path(job["run_dir"])
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    _setup_logging(run_dir, rank)
    torch.set_num_threads(int(job["threads_per_rank"]))
    cuda = torch.cuda.is_available()
    backend = cfg.distributed.backend if cfg.distributed.backend != "auto" else ("nccl" if cuda else "gloo")
    if not cuda:
        _without_inference_comm_op()
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    deepspeed.init_distributed(dist_backend=backend)
    comm = Collectives(device)
    started = time.perf_counter()

    tok = AutoTokenizer.from_pretrained(job["base_model"])
    objective = _objective(cfg, job, tok, rank, world, comm)
    per_step = cfg.micro_batch_size * cfg.grad_accum_steps
    lengths = objective.lengths if cfg.group_by_length else None
    order = _Order(objective.size, world, rank, cfg.seed, per_step, lengths)
    if order.steps_per_epoch < 1:
        raise ValueError(f"{objective.size} training items are too few for {world} ranks x {per_step} per step")
    total = min(cfg.max_steps or 10**12, cfg.epochs * order.steps_per_epoch)

    model = _build_model(cfg, job["base_model"])
    ds_config = dict(job["deepspeed"])
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = None if "optimizer" in ds_config else _optimizer(cfg, params, device)
    engine, _, _, _ = deepspeed.initialize(
        model=model, model_parameters=params, optimizer=optimizer, lr_scheduler=_schedule(cfg, total), config=ds_config
    )
    compiled = cfg.compile and cuda
    if compiled:
        engine.compile()
    stage = int(ds_config.get("zero_optimization", {}).get("stage", 0))
    ckpt_dir = run_dir / "checkpoints"
    start = _resume(engine, ckpt_dir, rank)
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

    def validate() -> dict[str, float]:
        # eagerly, also when compiled: a few validation batches a run are not worth compiling an inference graph
        with torch.compiler.set_stance("force_eager") if compiled else contextlib.nullcontext():
            return objective.validate(engine, comm)

    metrics_file = (run_dir / METRICS).open("a", encoding="utf-8") if rank == 0 else None
    val_curve = [] if start else [{"step": 0, **validate()}]
    bar = tqdm(
        total=total,
        initial=start,
        desc=f"fine-tune ({cfg.method}, {world} ranks)",
        unit="step",
        disable=rank != 0,
        mininterval=1.0,
        file=sys.stderr,
    )
    mbs, accum = cfg.micro_batch_size, cfg.grad_accum_steps
    batches = Prefetcher(
        lambda step, m: objective.batch(order.step(step)[m * mbs : (m + 1) * mbs]),
        range(start, total),
        micro_steps=accum,
        device=device,
    )
    tokens, t0, loss_value, eval_seconds = 0, time.perf_counter(), float("nan"), 0.0
    window = _Window(device)
    for step, micro, batch, batch_tokens in batches:
        loss = objective.loss(engine, batch)
        engine.backward(loss)
        engine.step()
        window.add(loss, 1.0 / accum)
        tokens += batch_tokens
        window.tokens += batch_tokens
        if micro + 1 < accum:
            continue
        window.steps += 1
        bar.update(1)
        last = step + 1 == total
        # bookkeeping every log_every steps, not every step: a collective, a host sync and a file write per step
        # cost several percent of a small model's step time
        evaluate = (step + 1) % cfg.eval_every == 0 or last
        if (step + 1) % cfg.log_every == 0 or evaluate:
            loss_value, rate = window.close(comm, world)
            row: dict[str, Any] = {"step": step + 1, "loss": loss_value, "lr": engine.get_lr()[0], "tokens_per_s": rate}
            if evaluate:
                t_eval = time.perf_counter()
                row.update(validate())
                val_curve.append({k: v for k, v in row.items() if k == "step" or k.startswith("val_")})
                eval_seconds += time.perf_counter() - t_eval
                window.since = time.perf_counter()  # the next window measures training alone
            if metrics_file:
                metrics_file.write(json.dumps(row) + "\n")
                metrics_file.flush()
            bar.set_postfix(loss=f"{loss_value:.3f}", tok_s=f"{rate:,.0f}", refresh=False)
        if (step + 1) % cfg.checkpoint_every == 0 and not last:
            _checkpoint(engine, ckpt_dir, step + 1, rank, cfg.keep_checkpoints, comm)
    batches.close()
    bar.close()
    train_seconds = time.perf_counter() - t0 - eval_seconds  # the optimizer loop alone
    all_tokens = int(comm.sum(torch.tensor([float(tokens)]))[0])
    peak_memory = torch.cuda.max_memory_allocated(device) if cuda else None  # rank 0's, before the export

    state = _consolidated_state(engine, stage, run_dir, rank, comm)
    if rank == 0:
        assert state is not None
        out = run_dir / "export"
        if out.exists():
            shutil.rmtree(out)
        exported = _export(cfg, job, state, out)
        equivalence = _equivalence(cfg, job, exported, out, objective.check_batch())
        result = {
            "method": cfg.method,
            "export_dir": str(out),
            "weights_hash": _export_hash(cfg, out),
            "steps": total,
            "resumed_from_step": start,
            "world_size": world,
            "backend": backend,
            "device": device.type,
            "compiled": compiled,
            "zero_stage": stage,
            "deepspeed_config": ds_config,
            "objective": "dpo" if isinstance(objective, Dpo) else "sft",
            "train_examples": objective.size,
            **objective.counts,
            "metrics": {
                **{f"{k}_initial": v for k, v in (val_curve[0] if val_curve else {}).items() if k.startswith("val_")},
                **{k: v for k, v in (val_curve[-1] if val_curve else {}).items() if k.startswith("val_")},
                "train_loss": loss_value,
                "val_loss_initial": val_curve[0]["val_loss"] if val_curve else None,
                "val_loss": val_curve[-1]["val_loss"] if val_curve else None,
                "tokens_per_s": all_tokens / train_seconds if train_seconds > 0 else 0.0,
                "train_tokens": all_tokens,
                "train_seconds": train_seconds,
                "peak_memory_bytes": peak_memory,
            },
            "equivalence": equivalence,
            "seconds": time.perf_counter() - started,
        }
        (run_dir / RESULT).write_text(json.dumps(result, indent=2) + "\n")
        log.info("export %s equivalence %s", out, equivalence)
    comm.barrier()
    if metrics_file:
        metrics_file.close()
    dist.destroy_process_group()


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m training.worker RUN_DIR/job.json", file=sys.stderr)
        return 2
    job = json.loads(Path(argv[0]).read_text(encoding="utf-8"))
    hold_as_rank(Path(job["run_dir"]))  # held until this rank exits, however it exits (training.runlock)
    # launchers start ranks in sessions of their own (torchrun) or in theirs (deepspeed's): a rank whose launcher
    # died stops at once instead of training on; it takes its own group down only when it leads it
    exit_with_parent(children_too=False, whole_group=os.getpgrp() == os.getpid())
    train(job)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
