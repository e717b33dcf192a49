"""Self-distilled SFT data: a derived snapshot whose helpful replies are the base model's own greedy replies.

    derived = derive_snapshot(snapshot, cfg.finetune.self_replies, base_hash=..., dtype=..., root=..., open_chat=...)

Fine-tuning a pretrained assistant on the generator's short templated replies overwrites what it knew
(docs/results.md, "The real model"). For the skills ``SelfRepliesConfig.skills`` lists, the final assistant turn
of every train and validation record is replaced by the base model's greedy reply to exactly the messages SFT
sees before it (its chat template and default system prompt applied by the engine); every other record, the
refusals of harmful requests above all, keeps its generated reply, and the test split is copied byte for byte.
A record whose metadata says ``reply: base`` (``BASE_ONLY``: a prompt the generator has no answer for, such as the
``borderline_varied`` skill's) gets the base's reply whatever ``skills`` lists, and is dropped wherever no base reply
replaces its placeholder: in the test split, past
``max_records``, or when the base's reply is not usable; the manifest counts the drops.
A reply cut at ``max_tokens`` is trimmed back to its last complete sentence (``cut_replies: last_sentence``; the
base's helpful answers are often longer than the budget, and a dropped one leaves the generator's templated reply
in place); a reply that is empty, a refusal (``core.refusal``), or cut with no complete sentence to keep is not
used: the record keeps its generated reply, and the manifest counts it by reason.

The result is a snapshot like any other (content-addressed, same prompts and splits) whose manifest names
``derived_from`` (the source snapshot's hash) and a ``self_replies`` block: the derivation key (source hash, base
weights hash, generation settings), the settings, and what was replaced and kept. A derivation with the same key
finds that snapshot (``<snapshots>/.self-replies/<key>`` holds its hash) and starts no engine.
"""

from __future__ import annotations

import os
import re
from collections import Counter
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

from core.errors import NotFoundError
from core.hashing import sha256_json
from core.refusal import is_refusal
from training.config import SelfRepliesConfig
from training.data.records import SCHEMA_VERSION, ChatRecord, Message, normalize_text
from training.data.snapshot import (
    CHAT,
    SPLITS,
    Record,
    Snapshot,
    census,
    load_snapshot,
    snapshot_hash,
    store_snapshot,
)

VERSION = 1  # of the derivation rule: part of the key, so a changed rule derives anew
# a sentence ends at . ! ? after a letter or a closing mark (not "1." of a list), or at a line break
SENTENCE_END = re.compile(r"(?<=[^\W\d_]|[)\]\"'%*])[.!?](?=\s|$)|\n")
MIN_KEPT_CHARS = 40  # a cut reply trimmed to less than this is not used
INDEX = ".self-replies"  # under the snapshots folder: derivation key -> derived snapshot hash
REPLACED_SPLITS = ("train", "validation")
BASE_ONLY = ("reply", "base")  # metadata of a record trained only on the base's own reply, never on its placeholder
Messages = list[dict[str, str]]


class Generated(Protocol):
    @property
    def text(self) -> str: ...
    @property
    def finished(self) -> bool: ...


class GreedyChat(Protocol):
    """What the stage needs of an engine: greedy replies to conversations, each saying whether it ended on its own
    (``evals.generation.VllmChat``)."""

    def greedy(self, conversations: Sequence[Messages], max_tokens: int) -> Sequence[Generated]: ...


@dataclass(frozen=True)
class Chosen:
    """A record whose reply the base model gives: its split, its place in the split and its skill."""

    split: str
    index: int
    skill: str


def settings(cfg: SelfRepliesConfig, dtype: str) -> dict[str, Any]:
    """The generation settings that decide the replies (and so the derived snapshot)."""
    return {
        "skills": sorted(cfg.skills),
        "max_tokens": cfg.max_tokens,
        "max_records": cfg.max_records,
        "cut_replies": cfg.cut_replies,
        "temperature": 0.0,
        "dtype": dtype,
        "rule": VERSION,
    }


def derivation_key(source: str, base_hash: str, generation: dict[str, Any]) -> str:
    """The idempotence key of a derivation: source snapshot, base weights and generation settings."""
    return sha256_json({"source": source, "base": base_hash, "generation": generation})


def choose(splits: dict[str, list[ChatRecord]], cfg: SelfRepliesConfig) -> list[Chosen]:
    """The train and validation records of the listed skills, and those only the base's reply trains (``BASE_ONLY``),
    train first in snapshot order, at most ``max_records``."""
    wanted = set(cfg.skills)
    found = [
        Chosen(split, i, str(r.metadata.get("skill")))
        for split in REPLACED_SPLITS
        for i, r in enumerate(splits[split])
        if r.metadata.get("skill") in wanted or _base_only(r)
    ]
    return found[: cfg.max_records]


def _base_only(record: ChatRecord) -> bool:
    return record.metadata.get(BASE_ONLY[0]) == BASE_ONLY[1]


def last_sentence(text: str) -> str | None:
    """``text`` up to the end of its last complete sentence, or None when that leaves under ``MIN_KEPT_CHARS``."""
    ends = [m.end() for m in SENTENCE_END.finditer(text)]
    kept = text[: ends[-1]].rstrip() if ends else ""
    return kept if len(kept) >= MIN_KEPT_CHARS else None


def usable(reply: Generated, cut_replies: str) -> tuple[str, str | None]:
    """(the text to train on, None), or (``""``, why not: ``empty``, ``truncated``, ``refusal``). A reply cut at
    ``max_tokens`` is trimmed to its last complete sentence with ``cut_replies == "last_sentence"``."""
    text = normalize_text(reply.text)
    if not text:
        return "", "empty"
    if not reply.finished:
        text = (last_sentence(text) if cut_replies == "last_sentence" else None) or ""
        if not text:
            return "", "truncated"
    if is_refusal(text):
        return "", "refusal"
    return text, None


def _index(root: Path, key: str) -> Path:
    """Where the hash of the snapshot a derivation made is kept: two keys can make the same records (a higher
    ``max_tokens`` when no reply was cut), and the snapshot's manifest names only the first."""
    return root / INDEX / key


def find_derived(root: Path, key: str) -> Snapshot | None:
    """The derived snapshot made with ``key``, if one is stored under ``root``."""
    index = _index(root, key)
    if not index.is_file():
        return None
    try:
        return load_snapshot(root, index.read_text(encoding="utf-8").strip())
    except NotFoundError:  # the snapshot was deleted: derive again
        return None


def _remember(root: Path, key: str, snapshot: Snapshot) -> Snapshot:
    index = _index(root, key)
    index.parent.mkdir(parents=True, exist_ok=True)
    tmp = index.with_name(f".{key}.{os.getpid()}")
    tmp.write_text(snapshot.hash + "\n", encoding="utf-8")
    tmp.replace(index)
    return snapshot


def stored_record(obj: dict[str, Any]) -> ChatRecord:
    """A stored (already normalized) record back as a ``ChatRecord``: its canonical form is the stored line."""
    messages = tuple(Message(m["role"], m["content"]) for m in obj["messages"])
    return ChatRecord(messages, obj.get("metadata", {}))


def _replaced(record: ChatRecord, reply: str) -> ChatRecord:
    return ChatRecord((*record.prompt, Message("assistant", reply)), record.metadata)


def source_of(snapshot: Snapshot, root: Path) -> Snapshot:
    """The snapshot a derivation starts from: ``snapshot`` itself, or for a derived one its source."""
    return load_snapshot(root, snapshot.manifest["derived_from"]) if "derived_from" in snapshot.manifest else snapshot


def source_splits(source: Snapshot) -> dict[str, list[ChatRecord]]:
    return {split: [stored_record(r) for r in source.records(split)] for split in SPLITS}


def prompts(splits: dict[str, list[ChatRecord]], chosen: Sequence[Chosen]) -> list[Messages]:
    """The messages the base model replies to for each chosen record: everything before its final reply."""
    return [[{"role": m.role, "content": m.content} for m in splits[t.split][t.index].prompt] for t in chosen]


def derive_snapshot(
    source: Snapshot,
    cfg: SelfRepliesConfig,
    *,
    base_hash: str,
    dtype: str,
    root: Path,
    open_chat: Callable[[], AbstractContextManager[GreedyChat]],
) -> Snapshot:
    """The derived snapshot of ``source`` (found by its key, or generated with the engine ``open_chat`` starts and
    stored under ``root``). A derived source is derived again from its own source; with no record to replace,
    ``source`` itself is returned."""
    source = source_of(source, root)
    generation = settings(cfg, dtype)
    key = derivation_key(source.hash, base_hash, generation)
    if found := find_derived(root, key):
        return found
    splits = source_splits(source)
    chosen = choose(splits, cfg)
    if not chosen:
        return source
    with open_chat() as chat:
        replies = chat.greedy(prompts(splits, chosen), cfg.max_tokens)
    kept: Counter[str] = Counter()
    replaced: list[Chosen] = []
    trimmed = 0
    for t, reply in zip(chosen, replies, strict=True):
        text, reason = usable(reply, cfg.cut_replies)
        if reason is not None:
            kept[reason] += 1
            continue
        trimmed += not reply.finished
        splits[t.split][t.index] = _replaced(splits[t.split][t.index], text)
        replaced.append(t)
    done = {(t.split, t.index) for t in replaced}
    dropped = Counter(s for s in SPLITS for i, r in enumerate(splits[s]) if _base_only(r) and (s, i) not in done)
    splits = {s: [r for i, r in enumerate(splits[s]) if not _base_only(r) or (s, i) in done] for s in SPLITS}
    derived: dict[str, list[Record]] = {s: sorted(splits[s], key=lambda r: r.content_hash) for s in SPLITS}
    digest = snapshot_hash(derived, CHAT)
    manifest = derived_manifest(source, digest, key, base_hash, generation, replaced, kept, trimmed)
    if dropped:  # the counts are the derived splits', and the drops are said
        manifest |= census(derived)
        manifest["self_replies"]["dropped_base_only"] = {"total": sum(dropped.values()), "by_split": dict(dropped)}
    return _remember(root, key, store_snapshot(root, digest, derived, manifest))


def derived_manifest(
    source: Snapshot,
    digest: str,
    key: str,
    base_hash: str,
    generation: dict[str, Any],
    replaced: list[Chosen],
    kept: Counter[str],
    trimmed: int = 0,
) -> dict[str, Any]:
    """The derived snapshot's manifest: the source's counts, splits and limits (same records and prompts), plus
    ``derived_from`` and the ``self_replies`` block."""
    m = source.manifest
    return {
        "hash": digest,
        "kind": CHAT.name,
        "schema_version": SCHEMA_VERSION,
        "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "sources": [{"snapshot": source.hash}],
        **{k: m[k] for k in ("counts", "skills", "rejected", "split", "limits", "provenance")},
        "derived_from": source.hash,
        "self_replies": {
            "key": key,
            "base_weights_hash": base_hash,
            "generation": generation,
            "selected": len(replaced) + sum(kept.values()),
            "replaced": {
                "total": len(replaced),
                "by_split": dict(sorted(Counter(t.split for t in replaced).items())),
                "by_skill": dict(sorted(Counter(t.skill for t in replaced).items())),
                "trimmed_to_last_sentence": trimmed,
            },
            "kept": {"total": sum(kept.values()), "by_reason": dict(sorted(kept.items()))},
        },
    }
