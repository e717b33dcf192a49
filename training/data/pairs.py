"""Preference pairs: the record the preference stage (DPO) trains on, its validation and its keys.

One JSON object per line::

    {"messages": [{"role": "system"|"user"|"assistant", "content": "..."}, ...],
     "chosen": "...", "rejected": "...", "metadata": {"source": "synthetic"|"feedback", ...scalars}}

``messages`` is the prompt: an optional system message first, then user and assistant turns alternating, ending
with a user turn; ``chosen`` and ``rejected`` are two assistant replies to it, the first preferred. Written by the
pair generator (``training/data/synth_pairs.py``) and by the curation of production feedback into
``$LIFECYCLE_HOME/data/curated/preferences/<content hash>.jsonl``; read by ``training/data/snapshot.py`` into pair
snapshots.

Contracts (each failure a :class:`~training.data.records.RecordInvalid` with a code): the prompt follows the chat
record's rules (``training/data/records.py``: schema, roles, empty turns, lengths) but ends with a user turn; both
replies are non-empty strings within the length limit; ``chosen`` and ``rejected`` differ after the dedup
normalization (case and spacing do not make a preference); ``metadata.source`` says where the pair came from.
Normalization and keys are the chat record's: the *prompt key* of a pair is the prompt key a chat record with
the same prompt has, so a pair snapshot splits by prompt the same way.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from training.config import SnapshotConfig
from training.data.records import (
    Canonical,
    Message,
    RecordInvalid,
    Scalar,
    check_fields,
    check_length,
    check_total,
    loose_text,
    messages_key,
    normalize_text,
    parse_messages,
    parse_metadata,
)

PAIR_SCHEMA_VERSION = 1
SOURCES = ("synthetic", "feedback")
CURATED_FOLDER = "preferences"  # under $LIFECYCLE_HOME/data/curated: pairs curated from production feedback


@dataclass(frozen=True)
class PreferenceRecord(Canonical):
    messages: tuple[Message, ...]  # the prompt
    chosen: str
    rejected: str
    metadata: Mapping[str, Scalar] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "messages": [{"role": m.role, "content": m.content} for m in self.messages],
            "chosen": self.chosen,
            "rejected": self.rejected,
            "metadata": dict(self.metadata),
        }

    @property
    def dedup_key(self) -> str:
        return messages_key(self.messages, self.chosen, self.rejected)

    @property
    def prompt_key(self) -> str:
        return messages_key(self.messages)

    @property
    def prompt(self) -> tuple[Message, ...]:
        return self.messages


def _reply(obj: dict[str, Any], name: str, limits: SnapshotConfig) -> str:
    raw = obj.get(name)
    if not isinstance(raw, str):
        raise RecordInvalid("schema", f"'{name}' must be a string, got {type(raw).__name__}")
    text = normalize_text(raw)
    if not text:
        raise RecordInvalid("empty_turn", f"'{name}' is empty")
    check_length(text, f"'{name}'", limits)
    return text


def parse_pair(obj: Any, limits: SnapshotConfig) -> PreferenceRecord:
    """Validate one decoded JSON value as a preference pair and return it normalized, or raise RecordInvalid."""
    obj = check_fields(obj, ("messages", "chosen", "rejected", "metadata"))
    messages = parse_messages(obj.get("messages"), limits, last="user")
    chosen, rejected = _reply(obj, "chosen", limits), _reply(obj, "rejected", limits)
    if loose_text(chosen) == loose_text(rejected):
        raise RecordInvalid("same_replies", "'chosen' and 'rejected' are the same reply (after normalizing)")
    check_total([m.content for m in messages] + [max(chosen, rejected, key=len)], limits)
    metadata = parse_metadata(obj)
    if metadata.get("source") not in SOURCES:
        raise RecordInvalid(
            "schema", f"metadata.source must be one of {', '.join(SOURCES)}, got {metadata.get('source')!r}"
        )
    return PreferenceRecord(tuple(messages), chosen, rejected, metadata)
