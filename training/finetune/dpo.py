"""DPO's pieces, pure torch: pair encoding, sequence log-probabilities, the loss, and the reference's log-probs.

The loss is the sigmoid DPO of Rafailov et al. (2023) on summed reply log-probabilities, or IPO (Azar et al. 2023)
on per-token mean log-probabilities (as TRL computes it)::

    h      = (log pi(chosen) - log ref(chosen)) - (log pi(rejected) - log ref(rejected))
    sigmoid: loss = -log sigmoid(beta * h)
    ipo:     loss = (h - 1 / (2 * beta)) ** 2
                                            (either + sft_weight * the chosen replies' per-token NLL)

Why sigmoid DPO by default: it is the variant with the fewest knobs (one: beta), an offline loss on fixed pairs (no
sampling loop, which a 2-core CPU cannot afford per step), and the one TRL's ``DPOTrainer`` defaults to, so results
compare. IPO is the bounded alternative: its loss is zero at a margin of ``1 / (2 beta)`` and grows again past
it, so pairs the policy already wins stop pulling it away from the reference (sigmoid DPO keeps pushing them).

A pair is two sequences rendered by the chat template, prompt + chosen and prompt + rejected, labelled on the
reply tokens only (``training/sft_data.encode``); a batch of B pairs is one forward pass over 2B sequences
(chosen first). The reference's log-probs are computed once per run, split over the ranks, and stored in the
run folder: the reference never sits in memory beside the policy, and a resumed run reads the same numbers.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, get_args

import torch
import torch.nn.functional as F

from training.config import PreferenceLoss
from training.finetune.collectives import Collectives
from training.finetune.sft_data import IGNORE, Example, collate, encode

REFERENCE_LOGPS = "reference_logps.pt"


@dataclass(frozen=True)
class PairExample:
    chosen: Example
    rejected: Example

    @property
    def length(self) -> int:
        return max(len(self.chosen.input_ids), len(self.rejected.input_ids))


@dataclass(frozen=True)
class EncodedPairs:
    pairs: list[PairExample]
    truncated: int  # pairs with a reply cut at max_seq_len
    skipped: int  # pairs left without a reply token (the prompt alone fills max_seq_len)


def _with_reply(record: dict[str, Any], reply: str) -> dict[str, Any]:
    return {"messages": [*record["messages"], {"role": "assistant", "content": reply}]}


def encode_pairs(records: Iterable[dict[str, Any]], tokenizer: Any, max_seq_len: int) -> EncodedPairs:
    pairs: list[PairExample] = []
    truncated = skipped = 0
    for record in records:
        both = encode(
            [_with_reply(record, record["chosen"]), _with_reply(record, record["rejected"])], tokenizer, max_seq_len
        )
        if both.skipped:
            skipped += 1
            continue
        truncated += int(both.truncated > 0)
        pairs.append(PairExample(*both.examples))
    return EncodedPairs(pairs, truncated, skipped)


def collate_pairs(pairs: Sequence[PairExample], pad_id: int) -> dict[str, torch.Tensor]:
    """One batch of 2B sequences: the B chosen, then the B rejected."""
    return collate([p.chosen for p in pairs] + [p.rejected for p in pairs], pad_id)


def sequence_logps(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per sequence: the summed log-probability of its labelled tokens (each predicted from the one before), and
    how many there are."""
    targets = labels[:, 1:]
    mask = targets != IGNORE
    logp = torch.log_softmax(logits[:, :-1].float(), dim=-1)
    picked = logp.gather(-1, targets.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    return (picked * mask).sum(-1), mask.sum(-1)


LOSSES = get_args(PreferenceLoss)


def dpo_loss(
    chosen: torch.Tensor,
    rejected: torch.Tensor,
    ref_chosen: torch.Tensor,
    ref_rejected: torch.Tensor,
    beta: float,
    kind: str = "sigmoid",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The mean ``kind`` loss (sigmoid DPO or IPO) over a batch, and each pair's implicit rewards (chosen,
    rejected) ``beta * (log pi - log ref)``."""
    chosen_ratio, rejected_ratio = chosen - ref_chosen, rejected - ref_rejected
    h = chosen_ratio - rejected_ratio
    if kind == "sigmoid":
        loss = -F.logsigmoid(beta * h).mean()
    elif kind == "ipo":
        loss = ((h - 1 / (2 * beta)) ** 2).mean()
    else:
        raise ValueError(f"unknown preference loss {kind!r} (one of {', '.join(LOSSES)})")
    return loss, beta * chosen_ratio.detach(), beta * rejected_ratio.detach()


def pair_loss(
    logits: torch.Tensor,
    labels: torch.Tensor,
    ref: torch.Tensor,
    beta: float,
    sft_weight: float,
    kind: str = "sigmoid",
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The preference stage's loss on one forward pass over a collated pair batch; ``ref`` is (B, 2) reference
    log-probs (chosen, rejected), summed over the reply tokens (IPO divides both by the reply's token count)."""
    logps, counts = sequence_logps(logits, labels)
    n = logps.shape[0] // 2
    pol, ref_ = logps, torch.cat([ref[:, 0], ref[:, 1]])
    if kind == "ipo":
        pol, ref_ = pol / counts.clamp(min=1), ref_ / counts.clamp(min=1)
    loss, chosen_r, rejected_r = dpo_loss(pol[:n], pol[n:], ref_[:n], ref_[n:], beta, kind)
    if sft_weight:
        loss = loss + sft_weight * (-(logps[:n] / counts[:n].clamp(min=1))).mean()
    stats = {"correct": (chosen_r > rejected_r).float().sum(), "margin": (chosen_r - rejected_r).sum()}
    return loss, stats


@torch.no_grad()
def pair_logps(
    model: torch.nn.Module,
    pairs: Sequence[PairExample],
    *,
    pad_id: int,
    batch_size: int,
    device: torch.device,
    rank: int = 0,
    world: int = 1,
) -> torch.Tensor:
    """(N, 2) float64 log-probs of every pair's chosen and rejected reply under ``model``, on ``device`` (filled
    without a host sync per batch); with ``world`` > 1 only this ``rank``'s share of the batches, the other rows
    left 0 (sum across ranks for all of them)."""
    values = torch.zeros(len(pairs), 2, dtype=torch.float64, device=device)
    for start in range(rank * batch_size, len(pairs), world * batch_size):
        chunk = pairs[start : start + batch_size]
        batch = {k: v.to(device) for k, v in collate_pairs(chunk, pad_id).items()}
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        logps, _ = sequence_logps(logits, batch["labels"])
        values[start : start + len(chunk)] = logps.view(2, -1).t().double()
    return values


def reference_logps(
    reference: str,
    pairs: Sequence[PairExample],
    *,
    pad_id: int,
    batch_size: int,
    rank: int,
    world: int,
    comm: Collectives,
    store: Path,
) -> torch.Tensor:
    """(N, 2) log-probs of every pair's chosen and rejected reply under the frozen ``reference`` model: read from
    ``store`` when an earlier start of this run wrote it, else computed (each rank a share of the batches, summed
    across ranks), written by rank 0 and returned. Every rank must call it."""
    if store.is_file():
        values: torch.Tensor = torch.load(store)
        return values
    from transformers import AutoModelForCausalLM

    model: torch.nn.Module = AutoModelForCausalLM.from_pretrained(reference, dtype=torch.float32)
    model.to(comm.device).eval()
    values = pair_logps(model, pairs, pad_id=pad_id, batch_size=batch_size, device=comm.device, rank=rank, world=world)
    del model
    values = comm.sum(values).float()  # each pair was computed by exactly one rank
    if rank == 0:
        pending = store.with_suffix(".tmp")
        torch.save(values, pending)
        os.replace(pending, store)
    comm.barrier()
    return values
