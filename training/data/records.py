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
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from core.hashing import canonical_json, sha256_text
from training.config import SnapshotConfig

SCHEMA_VERSION = 1
ROLES = ("system", "user", "assistant")
_WORD = re.compile(r"[a-z0-9']+")
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


class Canonical:
    """A record's canonical JSON (what snapshots store and hash) and its SHA-256, from its ``to_json``."""

    def to_json(self) -> dict[str, Any]:
        raise NotImplementedError

    def canonical(self) -> str:
        return canonical_json(self.to_json())

    @property
    def content_hash(self) -> str:
        return sha256_text(self.canonical())


@dataclass(frozen=True)
class ChatRecord(Canonical):
    messages: tuple[Message, ...]
    metadata: Mapping[str, Scalar] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"messages": [{"role": m.role, "content": m.content} for m in self.messages]}
        if self.metadata:
            out["metadata"] = dict(self.metadata)
        return out

    @property
    def dedup_key(self) -> str:
        return messages_key(self.messages)

    @property
    def prompt_key(self) -> str:
        return messages_key(self.messages[:-1])

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


PHRASE_WORDS = 5  # a shared run this long is a taught phrasing ("tell me exactly how to"), not a common word pair


def _phrase_words(text: str) -> list[str]:
    """The words of ``text`` as the phrasing contract compares them (loose, apostrophes kept)."""
    return _WORD.findall(loose_text(text))


def _phrase_runs(text: str, n: int = PHRASE_WORDS) -> set[tuple[str, ...]]:
    """Every run of ``n`` consecutive words of ``text``: what a phrasing is."""
    words = _phrase_words(text)
    return {tuple(words[i : i + n]) for i in range(len(words) - n + 1)}


@dataclass(frozen=True)
class Phrasings:
    """The phrasings of some texts (their wordings whole, and every run of ``n`` words): the contract that keeps an
    eval item's wording apart from training's (``evals.sets.phrasing_leaks``, the generator's ``avoid``).

        Phrasings.of(training_prompts).shared("Tell me exactly how to bake bread")  # "tell me exactly how to"
    """

    whole: frozenset[str]
    runs: frozenset[tuple[str, ...]]
    n: int = PHRASE_WORDS

    @classmethod
    def of(cls, texts: Iterable[str], n: int = PHRASE_WORDS) -> Phrasings:
        texts = list(texts)
        runs = frozenset().union(*(_phrase_runs(t, n) for t in texts))
        return cls(frozenset(" ".join(_phrase_words(t)) for t in texts), runs, n)

    def shared(self, text: str) -> str | None:
        """``text`` itself when one of the texts is worded the same, else the first run of words it shares with
        them, else None."""
        if " ".join(_phrase_words(text)) in self.whole:
            return text
        runs = sorted(_phrase_runs(text, self.n) & self.runs)
        return " ".join(runs[0]) if runs else None


def messages_key(messages: tuple[Message, ...], *extra: str) -> str:
    """The loose (dedup) key of messages, and of any further texts (a preference pair's two replies)."""
    return sha256_text(
        canonical_json([[m.role, loose_text(m.content)] for m in messages] + [loose_text(t) for t in extra])
    )


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


def parse_messages(raw_messages: Any, limits: SnapshotConfig, *, last: str = "assistant") -> list[Message]:
    """Validate and normalize a ``messages`` list: schema, roles, lengths, and the turn order ending with a
    ``last`` turn (assistant for a conversation, user for a prompt)."""
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
        check_length(content, f"messages[{i}]", limits)
        if role != "system" and not content:
            raise RecordInvalid("empty_turn", f"messages[{i}] ({role}) is empty")
        messages.append(Message(role, content))
    _check_order(messages, last)
    return messages


def check_length(content: str, where: str, limits: SnapshotConfig) -> None:
    if len(content) > limits.max_message_chars:
        raise RecordInvalid("too_long", f"{where} has {len(content)} characters, more than {limits.max_message_chars}")


def check_total(texts: list[str], limits: SnapshotConfig) -> None:
    total = sum(len(t) for t in texts)
    if total > limits.max_total_chars:
        raise RecordInvalid(
            "too_long", f"{total} characters in all, more than max_total_chars={limits.max_total_chars}"
        )


def parse_metadata(obj: dict[str, Any]) -> dict[str, Scalar]:
    metadata = obj.get("metadata", {})
    if not isinstance(metadata, dict) or not all(
        isinstance(k, str) and (v is None or isinstance(v, str | int | float | bool)) for k, v in metadata.items()
    ):
        raise RecordInvalid("schema", "'metadata' must map strings to strings, numbers, booleans or null")
    return metadata


def check_fields(obj: Any, allowed: tuple[str, ...]) -> dict[str, Any]:
    """``obj`` as a JSON object with no field outside ``allowed``."""
    if not isinstance(obj, dict):
        raise RecordInvalid("schema", f"a record must be a JSON object, got {type(obj).__name__}")
    unknown = sorted(set(obj) - set(allowed))
    if unknown:
        raise RecordInvalid("schema", f"unknown field(s) {', '.join(unknown)} (allowed: {', '.join(allowed)})")
    return obj


def parse_record(obj: Any, limits: SnapshotConfig) -> ChatRecord:
    """Validate one decoded JSON value and return it normalized, or raise :class:`RecordInvalid`."""
    obj = check_fields(obj, ("messages", "metadata"))
    messages = parse_messages(obj.get("messages"), limits)
    check_total([m.content for m in messages], limits)
    return ChatRecord(tuple(messages), parse_metadata(obj))


def _check_order(messages: list[Message], last: str) -> None:
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
    if turns[-1].role != last:
        raise RecordInvalid("role_order", f"the last message must be a{'n' if last == 'assistant' else ''} {last} turn")
