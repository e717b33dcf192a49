"""What a fine-tune rank optimizes: supervised fine-tuning on conversations, or DPO on preference pairs.

``training/finetune/worker.py`` runs the same loop for both (DeepSpeed engine, seeded order, checkpoints, resume, export
and its check); an objective owns the data and the loss: its training items and their lengths, the batch of a
step's indices, the loss of a batch, the validation measurement, and the batch the export check compares logits
on. The job file's ``objective`` section picks one (absent: SFT).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Protocol

import torch

from training.config import FinetuneConfig
from training.finetune.collectives import Collectives
from training.finetune.dpo import REFERENCE_LOGPS, collate_pairs, encode_pairs, pair_loss, reference_logps
from training.finetune.job import DpoObjective
from training.finetune.prefetch import to_device
from training.finetune.sft_data import collate, encode, pack


def records(path: Path) -> list[dict[str, Any]]:
    with path.open(encoding="utf-8") as f:
        return [json.loads(line) for line in f]


class Objective(Protocol):
    size: int  # training items
    lengths: list[int]  # tokens per item (group_by_length)
    counts: dict[str, int]  # what encoding did (truncated, skipped), for the log and the report

    def batch(self, indices: list[int]) -> dict[str, torch.Tensor]: ...
    def loss(self, engine: Any, batch: dict[str, torch.Tensor]) -> torch.Tensor: ...
    def validate(self, engine: Any, comm: Collectives) -> dict[str, float]: ...
    def check_batch(self) -> dict[str, torch.Tensor]: ...


class Sft:
    """Next-token loss on assistant tokens (``training/finetune/sft_data.py``)."""

    def __init__(self, cfg: FinetuneConfig, tok: Any, snapshot: Path, rank: int, world: int) -> None:
        train_set = encode(records(snapshot / "train.jsonl"), tok, cfg.max_seq_len)
        val_set = encode(records(snapshot / "validation.jsonl"), tok, cfg.max_seq_len)
        self.examples = pack(train_set.examples, cfg.max_seq_len) if cfg.packing else train_set.examples
        self.size, self.pad = len(self.examples), tok.pad_token_id
        self.lengths = [len(e.input_ids) for e in self.examples]
        self.counts = {"truncated": train_set.truncated, "skipped": train_set.skipped}
        # a compiled model sees one shape: packed batches (nearly full anyway) padded to max_seq_len, so
        # torch.compile traces once instead of once per batch width
        self.width = cfg.max_seq_len if cfg.compile and cfg.packing else None
        mbs = cfg.micro_batch_size
        val = val_set.examples[rank::world][: cfg.eval_batches * mbs] or self.examples[:1]
        self.val_batches = [collate(val[i : i + mbs], self.pad, self.width) for i in range(0, len(val), mbs)]
        self.fixed = collate((val_set.examples or self.examples)[:mbs], self.pad)

    def batch(self, indices: list[int]) -> dict[str, torch.Tensor]:
        return collate([self.examples[i] for i in indices], self.pad, self.width)

    def loss(self, engine: Any, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        loss: torch.Tensor = engine(**batch).loss
        return loss

    @torch.no_grad()
    def validate(self, engine: Any, comm: Collectives) -> dict[str, float]:
        """The token-weighted validation loss over every rank's batches (summed on the device: one host sync)."""
        engine.eval()
        total = torch.zeros((), dtype=torch.float64, device=comm.device)
        count = torch.zeros((), dtype=torch.float64, device=comm.device)
        for batch in self.val_batches:
            batch = to_device(batch, comm.device)
            n = (batch["labels"][:, 1:] != -100).sum()
            total += engine(**batch).loss.double() * n
            count += n
        engine.train()
        return {"val_loss": comm.mean(total, count)}

    def check_batch(self) -> dict[str, torch.Tensor]:
        return self.fixed


class Dpo:
    """The preference stage (``training/finetune/dpo.py``): pairs of the snapshot, reference log-probs of the frozen
    ``objective.reference_model``, the DPO loss (``loss``: sigmoid or IPO) with ``beta`` (and ``sft_weight``)."""

    def __init__(
        self,
        cfg: FinetuneConfig,
        objective: DpoObjective,
        tok: Any,
        snapshot: Path,
        run_dir: Path,
        rank: int,
        world: int,
        comm: Collectives,
    ) -> None:
        self.beta, self.sft_weight, self.kind = objective.beta, objective.sft_weight, str(objective.loss)
        train_set = encode_pairs(records(snapshot / "train.jsonl"), tok, cfg.max_seq_len)
        val_set = encode_pairs(records(snapshot / "validation.jsonl"), tok, cfg.max_seq_len)
        self.pairs, self.pad = train_set.pairs, tok.pad_token_id
        self.size = len(self.pairs)
        self.lengths = [p.length for p in self.pairs]
        self.counts = {"truncated": train_set.truncated, "skipped": train_set.skipped}
        ref = reference_logps(
            objective.reference_model,
            self.pairs + val_set.pairs,
            pad_id=self.pad,
            batch_size=cfg.micro_batch_size,
            rank=rank,
            world=world,
            comm=comm,
            store=run_dir / REFERENCE_LOGPS,
        )
        self.ref, val_ref = ref[: self.size], ref[self.size :]
        mbs = cfg.micro_batch_size
        mine = list(range(len(val_set.pairs)))[rank::world][: cfg.eval_batches * mbs]
        self.val_batches = [
            {
                **collate_pairs([val_set.pairs[i] for i in mine[k : k + mbs]], self.pad),
                "ref": val_ref[mine[k : k + mbs]],
            }
            for k in range(0, len(mine), mbs)
        ]
        self.fixed = collate([p.chosen for p in (val_set.pairs or self.pairs)[:mbs]], self.pad)

    def batch(self, indices: list[int]) -> dict[str, torch.Tensor]:
        return {**collate_pairs([self.pairs[i] for i in indices], self.pad), "ref": self.ref[indices]}

    def _forward(self, engine: Any, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        logits = engine(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        return pair_loss(logits, batch["labels"], batch["ref"], self.beta, self.sft_weight, self.kind)

    def loss(self, engine: Any, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return self._forward(engine, batch)[0]

    @torch.no_grad()
    def validate(self, engine: Any, comm: Collectives) -> dict[str, float]:
        """Mean DPO loss, reward accuracy (chosen rewarded above rejected) and mean reward margin, over every
        rank's validation pairs (summed on the device: one host sync)."""
        engine.eval()
        sums = torch.zeros(4, dtype=torch.float64, device=comm.device)  # loss x pairs, correct, margin, pairs
        for batch in self.val_batches:
            batch = to_device(batch, comm.device)
            loss, stats = self._forward(engine, batch)
            n = batch["ref"].shape[0]
            sums += torch.stack(
                [loss.double() * n, stats["correct"].double(), stats["margin"].double(), sums.new_tensor(n)]
            )
        engine.train()
        sums = comm.sum(sums)
        pairs = max(float(sums[3]), 1.0)
        return {
            "val_loss": float(sums[0]) / pairs,
            "val_reward_accuracy": float(sums[1]) / pairs,
            "val_reward_margin": float(sums[2]) / pairs,
        }

    def check_batch(self) -> dict[str, torch.Tensor]:
        return self.fixed
