"""Supervised fine-tuning examples: chat-template rendering with the loss on assistant tokens only.

Each conversation is rendered by the tokenizer's own chat template; ``return_assistant_tokens_mask`` marks the
tokens inside the template's ``{% generation %}`` blocks (assistant replies and their end-of-turn token), and
every other label is -100, so system prompts and user turns are context, never targets. Conversations longer
than ``max_seq_len`` are cut at the end; ones left without any assistant token are skipped and counted.

Packing (optional) concatenates whole conversations into sequences of up to ``max_seq_len`` tokens, so no
compute is spent on padding; attention is not masked between packed conversations (each starts with BOS and its
own role markers, the usual trade-off for short chats).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

IGNORE = -100


@dataclass(frozen=True)
class Example:
    input_ids: tuple[int, ...]
    labels: tuple[int, ...]

    @property
    def target_tokens(self) -> int:
        return sum(1 for label in self.labels if label != IGNORE)


@dataclass(frozen=True)
class Encoded:
    examples: list[Example]
    truncated: int
    skipped: int

    @property
    def tokens(self) -> int:
        return sum(len(e.input_ids) for e in self.examples)


def encode(records: Iterable[dict[str, Any]], tokenizer: Any, max_seq_len: int) -> Encoded:
    examples: list[Example] = []
    truncated = skipped = 0
    for record in records:
        out = tokenizer.apply_chat_template(
            record["messages"], tokenize=True, return_dict=True, return_assistant_tokens_mask=True
        )
        ids, mask = list(out["input_ids"]), list(out["assistant_masks"])
        if len(ids) > max_seq_len:
            ids, mask = ids[:max_seq_len], mask[:max_seq_len]
            truncated += 1
        labels = [tok if m else IGNORE for tok, m in zip(ids, mask, strict=True)]
        if all(label == IGNORE for label in labels):
            skipped += 1
            continue
        examples.append(Example(tuple(ids), tuple(labels)))
    return Encoded(examples, truncated, skipped)


def pack(examples: Sequence[Example], max_seq_len: int) -> list[Example]:
    """Greedy, order-preserving packing of whole examples into sequences of at most ``max_seq_len`` tokens."""
    packed: list[Example] = []
    ids: list[int] = []
    labels: list[int] = []
    for ex in examples:
        if ids and len(ids) + len(ex.input_ids) > max_seq_len:
            packed.append(Example(tuple(ids), tuple(labels)))
            ids, labels = [], []
        ids += ex.input_ids
        labels += ex.labels
    if ids:
        packed.append(Example(tuple(ids), tuple(labels)))
    return packed


def collate(batch: Sequence[Example], pad_id: int, width: int | None = None) -> dict[str, torch.Tensor]:
    """Right-pad to the longest example (or to ``width``, for one shape in every batch); padding is masked out of
    attention and loss."""
    width = max([len(e.input_ids) for e in batch] + [width or 0])
    input_ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
    labels = torch.full((len(batch), width), IGNORE, dtype=torch.long)
    attention = torch.zeros((len(batch), width), dtype=torch.long)
    for i, e in enumerate(batch):
        n = len(e.input_ids)
        input_ids[i, :n] = torch.tensor(e.input_ids)
        labels[i, :n] = torch.tensor(e.labels)
        attention[i, :n] = 1
    return {"input_ids": input_ids, "labels": labels, "attention_mask": attention}
