"""DeepSpeed fine-tuning, parent side: ``finetune(cfg, snapshot, base_model, run_dir) -> TrainResult``.

Writes ``run_dir/job.json`` (the resolved fine-tune config, snapshot and base-model paths, the DeepSpeed config
with run-dependent values filled in), starts ``world_size`` ranks of ``training/finetune/worker.py`` with torchrun or
the ``deepspeed`` launcher (a hostfile passes through for multi-node), and reads the rank-0 report. Each rank gets
``OMP_NUM_THREADS`` (launchers do not set it); on CPU the ranks use gloo, on GPUs NCCL.

The run folder is the unit of resumption: rerunning with the same ``run_dir`` continues from its newest
checkpoint. ``train_key`` names it from everything that determines the weights (snapshot, base weights, config,
and for the preference stage its objective: beta, the NLL weight and the reference's weights), so the flow can
tell a finished run from a new one.

The preference stage is the same call with a :class:`DpoSpec`: ``snapshot`` is then a pair snapshot, ``base``
the SFT model it starts from, and the ranks optimize DPO (``training/finetune/objectives.py``).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from core.errors import ConfigError, NotFoundError, TrainingError
from core.hashing import sha256_json
from core.process import dying_with_parent, free_port
from training.config import FinetuneConfig
from training.data.snapshot import Snapshot
from training.finetune.checkpoint import LATEST
from training.finetune.job import JOB, RESULT, DpoObjective, RankJob, TrainReport
from training.finetune.node import failure_line, report_path
from training.finetune.runlock import exclusive_launch
from training.finetune.worker import METRICS
from training.model.modelio import ModelFolder

REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class DpoSpec:
    """The preference stage's objective: DPO (``loss``: sigmoid or IPO) with ``beta`` (and ``sft_weight``) against
    the frozen ``reference``."""

    beta: float
    sft_weight: float
    reference: ModelFolder
    loss: str = "sigmoid"

    def job(self) -> DpoObjective:
        return DpoObjective(
            loss=self.loss,  # a PreferenceLoss, checked by the model
            beta=self.beta,
            sft_weight=self.sft_weight,
            reference_model=str(self.reference.path),
        )

    def key(self) -> dict[str, Any]:
        key = {"kind": "dpo", "beta": self.beta, "sft_weight": self.sft_weight, "reference": self.reference.identity}
        return key if self.loss == "sigmoid" else {**key, "loss": self.loss}  # sigmoid runs keep their keys


@dataclass(frozen=True)
class TrainResult:
    run_dir: Path
    export_dir: Path
    method: str
    weights_hash: str
    steps: int
    metrics: dict[str, Any]
    equivalence: dict[str, Any]
    deepspeed_config: dict[str, Any]
    report: TrainReport

    @classmethod
    def of(cls, run_dir: Path, report: TrainReport) -> TrainResult:
        """The result of the run in ``run_dir`` from rank 0's report."""
        return cls(
            run_dir=run_dir,
            export_dir=Path(report.export_dir),
            method=report.method,
            weights_hash=report.weights_hash,
            steps=report.steps,
            metrics=dict(report.metrics),
            equivalence=report.equivalence.model_dump(),
            deepspeed_config=report.deepspeed_config,
            report=report,
        )

    def curve(self) -> list[dict[str, Any]]:
        """Per-step metrics written by rank 0 (loss, lr, tokens/s, and val_loss where measured)."""
        rows = [json.loads(line) for line in (self.run_dir / METRICS).read_text().splitlines() if line.strip()]
        last: dict[int, dict[str, Any]] = {}
        for row in rows:  # a resumed run rewrites the steps after its checkpoint: keep the newest
            last[row["step"]] = row
        return [last[s] for s in sorted(last)]


def resolve_deepspeed_config(cfg: FinetuneConfig, section: str = "finetune") -> tuple[Path, dict[str, Any]]:
    """The DeepSpeed config the run uses, with the values we own filled in; errors name ``section`` (the config
    key of ``cfg``: finetune, or preference.train)."""
    path = Path(cfg.deepspeed_config)
    path = path if path.is_absolute() else REPO / path
    if not path.is_file():
        raise ConfigError(f"config: {section}.deepspeed_config = {cfg.deepspeed_config!r}: file not found ({path})")
    try:
        ds = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ConfigError(
            f"config: {section}.deepspeed_config: {path} is not valid JSON ({exc.msg}, line {exc.lineno})"
        ) from None
    if not isinstance(ds, dict):
        raise ConfigError(f"config: {section}.deepspeed_config: {path} must hold a JSON object")
    zero = ds.get("zero_optimization", {})
    stage = zero.get("stage", 0) if isinstance(zero, dict) else None
    if stage not in (0, 1, 2, 3):
        raise ConfigError(f"config: {section}.deepspeed_config: zero_optimization.stage must be 0-3, got {stage!r}")
    if cfg.bf16 and stage == 0:
        raise ConfigError(f"config: {section}.bf16 needs ZeRO stage 1-3 (stage 0 keeps bf16 gradients)")
    ds["train_micro_batch_size_per_gpu"] = cfg.micro_batch_size
    ds["gradient_accumulation_steps"] = cfg.grad_accum_steps
    ds["train_batch_size"] = cfg.micro_batch_size * cfg.grad_accum_steps * cfg.distributed.total_ranks
    ds["gradient_clipping"] = cfg.max_grad_norm
    ds["bf16"] = {**ds.get("bf16", {}), "enabled": cfg.bf16}
    if "optimizer" in ds:  # DeepSpeed's own optimizer (offload configs): fill the values we own
        params = ds["optimizer"].setdefault("params", {})
        params["lr"] = cfg.learning_rate if params.get("lr", "auto") == "auto" else params["lr"]
        params["weight_decay"] = (
            cfg.weight_decay if params.get("weight_decay", "auto") == "auto" else params["weight_decay"]
        )
    return path, ds


def train_key(cfg: FinetuneConfig, snapshot: Snapshot, base: ModelFolder, objective: DpoSpec | None = None) -> str:
    """Everything that determines the fine-tuned weights, hashed (an SFT key is what it was before objectives)."""
    _, ds = resolve_deepspeed_config(cfg)
    key: dict[str, Any] = {
        "snapshot": snapshot.hash,
        "base": base.identity,
        # self_replies shaped the snapshot, whose hash is here: a run's key stays what it was without the stage
        "config": cfg.model_dump(mode="json", exclude={"self_replies"}),
        "deepspeed": ds,
    }
    if objective is not None:
        key["objective"] = objective.key()
    return sha256_json(key)[:16]


DEFAULT_MULTI_NODE_PORT = 29500  # a free port on the launching host says nothing about the other nodes


def first_host(hostfile: str) -> str:
    """The first host of a DeepSpeed hostfile (``host slots=N`` lines, ``#`` comments): rank 0's node."""
    for line in Path(hostfile).read_text(encoding="utf-8").splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            return line.split()[0]
    raise ConfigError(f"finetune.distributed.hostfile {hostfile} names no host")


def launch_command(cfg: FinetuneConfig, job_path: Path, node_rank: int = 0) -> list[str]:
    """The command that starts this node's ranks: torchrun's agent under ``training.finetune.node`` (which reports how
    they ended), or the ``deepspeed`` launcher (which, with a hostfile, starts every node's ranks over pdsh/ssh)."""
    d = cfg.distributed
    multi_node = d.nnodes > 1 or (d.launcher == "deepspeed" and d.hostfile is not None)
    if d.launcher == "deepspeed":
        port = str(d.master_port or (DEFAULT_MULTI_NODE_PORT if multi_node else free_port()))
        sibling = Path(sys.executable).parent / "deepspeed"  # the launcher of this interpreter's environment
        exe = str(sibling) if sibling.is_file() else (shutil.which("deepspeed") or "deepspeed")
        if d.hostfile is not None:  # multi-node: the hostfile names the hosts and their slots; rank 0 on the first
            addr = d.master_addr or first_host(d.hostfile)
            cmd = [exe, "--hostfile", d.hostfile, "--master_addr", addr, "--master_port", port]
        else:  # one node: world_size local ranks
            cmd = [exe, "--master_addr", d.master_addr or "127.0.0.1", "--master_port", port]
            cmd += ["--num_nodes", "1", "--num_gpus", str(d.world_size)]
        # the worker reads LOCAL_RANK from the environment, as under torchrun
        return [*cmd, "--no_local_rank", "--module", "training.finetune.worker", str(job_path)]
    report = report_path(job_path.parent, node_rank)
    if multi_node or d.master_port:
        # torchrun's static rendezvous: every node is told the node count, its own rank and where node 0 listens
        port = str(d.master_port or DEFAULT_MULTI_NODE_PORT)
        addr = d.master_addr or "127.0.0.1"
        rendezvous = [f"--master_addr={addr}", f"--master_port={port}"]
    else:
        # one node, no port given: the agent's store listens on a port the OS picks (port 0), so two runs started at
        # once cannot race for a port probed free a moment earlier (seen as EADDRINUSE with tests 3 at a time)
        rendezvous = ["--rdzv-backend=c10d", "--rdzv-endpoint=127.0.0.1:0", f"--rdzv-id={job_path.parent.name}"]
    return [
        sys.executable,
        "-m",
        "training.finetune.node",
        "--report",
        str(report),
        "--",
        f"--nnodes={d.nnodes}",
        f"--node_rank={node_rank}",
        f"--nproc_per_node={d.world_size}",
        *rendezvous,
        "-m",
        "training.finetune.worker",
        str(job_path),
    ]


def rank_environment(cfg: FinetuneConfig, threads: int) -> dict[str, str]:
    """The environment of a node's ranks: threads (launchers do not set them), the repository on the path, the
    interface the collectives use."""
    env = {
        **os.environ,
        "OMP_NUM_THREADS": str(threads),
        "PYTHONUNBUFFERED": "1",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
    }
    if cfg.distributed.socket_ifname:
        env["GLOO_SOCKET_IFNAME"] = env["NCCL_SOCKET_IFNAME"] = cfg.distributed.socket_ifname
    return env


def node_reports(run_dir: Path, nnodes: int, since: float, wait_s: float) -> list[dict[str, Any]]:
    """The nodes' reports of the attempt that started at ``since``, waiting up to ``wait_s`` for all of them (a
    node notices its ranks' end a moment after the node whose rank died)."""
    deadline = time.monotonic() + wait_s
    while True:
        found = []
        for k in range(nnodes):
            path = report_path(run_dir, k)
            with contextlib.suppress(OSError, ValueError):
                report = json.loads(path.read_text(encoding="utf-8"))
                if report.get("ended", 0) >= since:
                    found.append(report)
        if len(found) == nnodes or time.monotonic() >= deadline:
            return found
        time.sleep(0.5)


REPORT_WAIT_S = 30.0  # how long node 0 waits for the other nodes' reports after its own ranks ended


def _failed(
    cfg: FinetuneConfig, run_dir: Path, code: int, since: float, node_rank: int = 0, wait_s: float = REPORT_WAIT_S
) -> TrainingError:
    """One line: which node's rank failed and how (exit code, signal), what the other ranks did, how to resume."""
    d = cfg.distributed
    reports = node_reports(run_dir, d.nnodes, since, wait_s=wait_s if d.nnodes > 1 and node_rank == 0 else 0)
    line = failure_line(reports) or f"the launcher exited with code {code}"
    missing = sorted(set(range(d.nnodes)) - {r["node_rank"] for r in reports})
    if missing and d.launcher == "torchrun" and node_rank == 0:
        line += f"; no report from node {', '.join(map(str, missing))} (its launcher is gone too?)"
    step = resumable_step(run_dir)
    resume = f"resumable from step {step}" if step else "no checkpoint yet: a rerun starts again"
    if d.nnodes > 1:
        resume += f" (lifecycle train on node 0, lifecycle train-node {run_dir} --node-rank K on the others)"
    return TrainingError(
        f"fine-tuning failed: {line}; {resume}. Rank logs in {run_dir / 'logs'}:\n" + _log_tail(run_dir)
    )


def _log_tail(run_dir: Path, lines: int = 15) -> str:
    tails = []
    for log in sorted((run_dir / "logs").glob("rank*.log")):
        text = log.read_text(errors="replace").strip().splitlines()
        tails += [f"{log.name}: {line}" for line in text[-lines:]]
    return "\n".join(tails)


def resumable_step(run_dir: Path) -> int:
    """The step of the committed checkpoint an unfinished run in ``run_dir`` resumes from (0: none, or finished)."""
    latest = run_dir / "checkpoints" / LATEST
    if (run_dir / RESULT).is_file() or not latest.is_file():
        return 0
    number = latest.read_text().strip().removeprefix("step")
    return int(number) if number.isdigit() else 0


def _launch(
    cfg: FinetuneConfig,
    snapshot: Snapshot,
    base: ModelFolder,
    run_dir: Path,
    ds: dict[str, Any],
    objective: DpoSpec | None,
) -> None:
    """Write the job file and run the ranks to the end (they resume from the run's last checkpoint)."""
    threads = cfg.distributed.threads_per_rank or max(1, (os.cpu_count() or 1) // cfg.distributed.world_size)
    job = RankJob(
        config=cfg,
        snapshot_path=str(snapshot.path),
        snapshot_hash=snapshot.hash,
        base_model=str(base.path),
        run_dir=str(run_dir),
        deepspeed=ds,
        threads_per_rank=threads,
        objective=objective.job() if objective is not None else None,
    )
    job_path = run_dir / JOB
    job.write(job_path)
    if cfg.distributed.nnodes > 1:
        others = range(1, cfg.distributed.nnodes)
        joins = "\n".join(f"  lifecycle train-node {run_dir} --node-rank {k}" for k in others)
        print(f"fine-tune on {len(others) + 1} nodes; start the others:\n{joins}", file=sys.stderr, flush=True)
    since = time.time()
    # the ranks' output is progress and logs, never a command's result: it goes to stderr (fd 2)
    # the launcher dies with this process however it dies (SIGKILL included), and its ranks with it (worker.main)
    cmd = dying_with_parent(launch_command(cfg, job_path))
    proc = subprocess.run(cmd, env=rank_environment(cfg, threads), cwd=str(REPO), stdout=2, check=False)
    if proc.returncode != 0 or not (run_dir / RESULT).is_file():
        raise _failed(cfg, run_dir, proc.returncode, since)


def finetune(
    cfg: FinetuneConfig, snapshot: Snapshot, base: ModelFolder, run_dir: Path, objective: DpoSpec | None = None
) -> TrainResult:
    """Train (or resume, or just read back a finished run in ``run_dir``) and return the checked export; with
    ``objective``, the preference stage on a pair snapshot."""
    for split in ("train", "validation"):
        if not snapshot.split_path(split).is_file():
            raise NotFoundError(f"snapshot {snapshot.short} has no {split} split at {snapshot.path}")
    _, ds = resolve_deepspeed_config(cfg)
    result_path = run_dir / RESULT
    if not result_path.is_file():
        with exclusive_launch(run_dir):
            if not result_path.is_file():  # a launch this one waited for may have finished the run
                _launch(cfg, snapshot, base, run_dir, ds, objective)
    report = TrainReport.read(result_path)
    eq = report.equivalence
    if not eq.passed:
        raise TrainingError(
            f"export check failed: logits differ by {eq.max_abs_logit_diff:.3g} "
            f"(> {eq.atol}) between the training model and {report.export_dir}"
        )
    return TrainResult.of(run_dir, report)


def join(run_dir: Path, node_rank: int) -> None:
    """Run node ``node_rank``'s ranks of the multi-node fine-tune whose job node 0 wrote to ``run_dir`` (a folder
    every node shares); returns when they finished, raises ``TrainingError`` saying which rank failed and how."""
    job_path = run_dir / JOB
    if not job_path.is_file():
        raise NotFoundError(f"no fine-tune job at {job_path}: start node 0 (lifecycle train) first")
    job = RankJob.read(job_path)
    cfg = job.config
    nnodes = cfg.distributed.nnodes
    if nnodes < 2:
        raise ConfigError(f"the fine-tune in {run_dir} runs on one node: nothing to join")
    if not 0 < node_rank < nnodes:
        raise ConfigError(f"--node-rank must be 1..{nnodes - 1} for this {nnodes}-node fine-tune, got {node_rank}")
    since = time.time()
    cmd = launch_command(cfg, job_path, node_rank)
    env = rank_environment(cfg, job.threads_per_rank)
    proc = subprocess.run(cmd, env=env, cwd=str(REPO), stdout=2, check=False)
    if proc.returncode != 0:
        raise _failed(cfg, run_dir, proc.returncode, since, node_rank)
