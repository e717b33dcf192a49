"""Supervised fine-tuning examples: chat-template rendering with the loss on assistant tokens only.

Each conversation is rendered by the tokenizer's own chat template; ``return_assistant_tokens_mask`` marks the
tokens inside the template's ``{% generation %}`` blocks (assistant replies and their end-of-turn token), and
every other label is -100, so system prompts and user turns are context, never targets. A pretrained model's own
template rarely has those blocks (SmolLM2's ChatML does not): there each reply's span is found by rendering the
conversation up to it (with the generation prompt) and up to its end, and the tokens that start inside the span
(the reply and its end-of-turn token, not the newline after it) are the targets; the model keeps its template
byte for byte. Conversations longer
than ``max_seq_len`` are cut at the end; ones left without any assistant token are skipped and counted.

Packing (optional) concatenates whole conversations into sequences of up to ``max_seq_len`` tokens, so no
compute is spent on padding; attention is not masked between packed conversations (each starts with BOS and its
own role markers, the usual trade-off for short chats).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from core.errors import ModelError

IGNORE = -100
_GENERATION_BLOCK = re.compile(r"{%-?\s*generation\s*-?%}")


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
    marked = bool(_GENERATION_BLOCK.search(str(tokenizer.chat_template or "")))
    for record in records:
        ids, mask = (_marked if marked else _by_prefixes)(tokenizer, record["messages"])
        if len(ids) > max_seq_len:
            ids, mask = ids[:max_seq_len], mask[:max_seq_len]
            truncated += 1
        labels = [tok if m else IGNORE for tok, m in zip(ids, mask, strict=True)]
        if all(label == IGNORE for label in labels):
            skipped += 1
            continue
        examples.append(Example(tuple(ids), tuple(labels)))
    return Encoded(examples, truncated, skipped)


def _marked(tokenizer: Any, messages: list[dict[str, Any]]) -> tuple[list[int], list[int]]:
    out = tokenizer.apply_chat_template(messages, tokenize=True, return_dict=True, return_assistant_tokens_mask=True)
    return list(out["input_ids"]), list(out["assistant_masks"])


def _by_prefixes(tokenizer: Any, messages: list[dict[str, Any]]) -> tuple[list[int], list[int]]:
    """Input ids and assistant mask of a template without generation blocks, from the rendered prefixes."""
    text = tokenizer.apply_chat_template(messages, tokenize=False)
    spans = []
    for i, message in enumerate(messages):
        if message["role"] != "assistant" or i == 0:
            continue
        head = tokenizer.apply_chat_template(messages[:i], tokenize=False, add_generation_prompt=True)
        upto = tokenizer.apply_chat_template(messages[: i + 1], tokenize=False)
        if not (text.startswith(upto) and upto.startswith(head)):
            raise ModelError("the chat template does not render a conversation's prefixes as prefixes of it")
        spans.append((len(head), len(upto.rstrip())))
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    mask = [int(any(a <= start < b for a, b in spans)) for start, _ in enc["offset_mapping"]]
    return list(enc["input_ids"]), mask


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
