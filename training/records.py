"""Chat records in OpenAI messages format: validation, normalization and the keys snapshots are built on.

A record is one JSON object per line::

    {"messages": [{"role": "system"|"user"|"assistant", "content": "..."}, ...], "metadata": {...}}

Contracts (each failure is a :class:`RecordInvalid` with a short code and a readable reason):

- ``messages`` is a list of objects with ``role`` and ``content`` (a string, or OpenAI text parts);
- an optional system message comes first, then user and assistant turns alternate, starting with a user turn
  and ending with an assistant turn; no user or assistant turn is blank;
- message count and lengths stay within the configured limits;
- ``metadata`` (optional) maps strings to scalars.

Normalization (what is stored and hashed): Unicode NFC, ``\\r\\n`` to ``\\n``, content stripped at both ends.
The *dedup key* goes further (NFKC, case-folded, whitespace collapsed) so records differing only in case or
spacing count as duplicates; the *prompt key* is the dedup key of everything before the final assistant turn,
and decides the split, so the same prompt can never sit in both train and test.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from core.hashing import canonical_json, sha256_text
from training.config import SnapshotConfig

SCHEMA_VERSION = 1
ROLES = ("system", "user", "assistant")
_WS = re.compile(r"\s+")
Scalar = str | int | float | bool | None


class RecordInvalid(ValueError):
    def __init__(self, code: str, reason: str) -> None:
        super().__init__(reason)
        self.code = code
        self.reason = reason


@dataclass(frozen=True)
class Message:
    role: str
    content: str


@dataclass(frozen=True)
class ChatRecord:
    messages: tuple[Message, ...]
    metadata: Mapping[str, Scalar] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"messages": [{"role": m.role, "content": m.content} for m in self.messages]}
        if self.metadata:
            out["metadata"] = dict(self.metadata)
        return out

    def canonical(self) -> str:
        return canonical_json(self.to_json())

    @property
    def content_hash(self) -> str:
        return sha256_text(self.canonical())

    @property
    def dedup_key(self) -> str:
        return _key(self.messages)

    @property
    def prompt_key(self) -> str:
        return _key(self.messages[:-1])

    @property
    def prompt(self) -> tuple[Message, ...]:
        return self.messages[:-1]

    @property
    def completion(self) -> str:
        return self.messages[-1].content


def normalize_text(text: str) -> str:
    return unicodedata.normalize("NFC", text.replace("\r\n", "\n").replace("\r", "\n")).strip()


def loose_text(text: str) -> str:
    return _WS.sub(" ", unicodedata.normalize("NFKC", text).casefold()).strip()


def _key(messages: tuple[Message, ...]) -> str:
    return sha256_text(canonical_json([[m.role, loose_text(m.content)] for m in messages]))


def _content(raw: Any, index: int) -> str:
    if isinstance(raw, str):
        return raw
    if isinstance(raw, list):  # OpenAI content parts: [{"type": "text", "text": "..."}]
        texts = []
        for part in raw:
            if not (isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)):
                raise RecordInvalid("schema", f"messages[{index}].content: only text parts are supported")
            texts.append(part["text"])
        return "".join(texts)
    raise RecordInvalid("schema", f"messages[{index}].content must be a string, got {type(raw).__name__}")


def parse_record(obj: Any, limits: SnapshotConfig) -> ChatRecord:
    """Validate one decoded JSON value and return it normalized, or raise :class:`RecordInvalid`."""
    if not isinstance(obj, dict):
        raise RecordInvalid("schema", f"a record must be a JSON object, got {type(obj).__name__}")
    unknown = sorted(set(obj) - {"messages", "metadata"})
    if unknown:
        raise RecordInvalid("schema", f"unknown field(s) {', '.join(unknown)} (allowed: messages, metadata)")
    raw_messages = obj.get("messages")
    if not isinstance(raw_messages, list) or not raw_messages:
        raise RecordInvalid("schema", "'messages' must be a non-empty list")
    if len(raw_messages) > limits.max_messages:
        raise RecordInvalid("too_long", f"{len(raw_messages)} messages, more than max_messages={limits.max_messages}")

    messages = []
    for i, raw in enumerate(raw_messages):
        if not isinstance(raw, dict):
            raise RecordInvalid("schema", f"messages[{i}] must be an object")
        extra = sorted(set(raw) - {"role", "content"})
        if extra:
            raise RecordInvalid("schema", f"messages[{i}] has unknown field(s) {', '.join(extra)}")
        role = raw.get("role")
        if role not in ROLES:
            raise RecordInvalid("schema", f"messages[{i}].role must be one of {', '.join(ROLES)}, got {role!r}")
        content = normalize_text(_content(raw.get("content"), i))
        if len(content) > limits.max_message_chars:
            raise RecordInvalid(
                "too_long",
                f"messages[{i}] has {len(content)} characters, more than {limits.max_message_chars}",
            )
        if role != "system" and not content:
            raise RecordInvalid("empty_turn", f"messages[{i}] ({role}) is empty")
        messages.append(Message(role, content))

    _check_order(messages)
    total = sum(len(m.content) for m in messages)
    if total > limits.max_total_chars:
        raise RecordInvalid(
            "too_long", f"{total} characters in all, more than max_total_chars={limits.max_total_chars}"
        )

    metadata = obj.get("metadata", {})
    if not isinstance(metadata, dict) or not all(
        isinstance(k, str) and (v is None or isinstance(v, str | int | float | bool)) for k, v in metadata.items()
    ):
        raise RecordInvalid("schema", "'metadata' must map strings to strings, numbers, booleans or null")
    return ChatRecord(tuple(messages), metadata)


def _check_order(messages: list[Message]) -> None:
    turns = messages[1:] if messages[0].role == "system" else messages
    if not turns:
        raise RecordInvalid("role_order", "a conversation needs at least one user and one assistant turn")
    for i, m in enumerate(turns):
        expected = "user" if i % 2 == 0 else "assistant"
        if m.role != expected:
            offset = len(messages) - len(turns)
            raise RecordInvalid(
                "role_order",
                f"messages[{i + offset}] is {m.role!r} where {expected!r} was expected "
                "(optional system first, then user/assistant alternating)",
            )
    if turns[-1].role != "assistant":
        raise RecordInvalid("role_order", "the last message must be an assistant turn")
