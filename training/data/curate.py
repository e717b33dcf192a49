"""Curation of production conversations into training records: ``curate(conversations, ...) -> Curation``.

Pure: the conversations come in as plain records (``SourceConversation``, read from the serving store by
``flows/curation.py``), the safety filters through the small ``SafetyChecker`` Protocol below (training never
imports serving), and what comes out is ``ChatRecord``s in the snapshot's input format plus a JSON-able
``CurationReport``. Writing them as a JSONL source of the next snapshot is the caller's job.

Rules, in the order they apply:

1. **Consent at export time.** Only conversations whose key is active *now* and has ``training_opt_in`` set
   (``opted_in``), and that are not (soft-)deleted. A key that opts out or is revoked, or a deleted conversation,
   contributes nothing (counted ``not_opted_in``, ``deleted``; the caller also withdraws what earlier exports took).
2. **One record per completed exchange in the window.** A conversation's stored messages are cut into exchanges:
   one user turn, then the assistant reply (an optional system prompt comes first). Every assistant reply written in
   ``[since, until)`` is a candidate; its record holds the conversation up to it (system prompt, earlier exchanges
   as context, the user turn, the reply). Replies the gateway wrote itself (request-log status other than ``ok``: a
   pre-filter refusal, a reply stopped by the post-filter) are ``not_completed``; a reply with no matching log row
   (status unknown) is taken as stored. Anything else than user-then-assistant (tool messages, several user turns,
   a system message mid-conversation) is ``malformed``.
3. **Safety.** A pair is ``unsafe`` when its prompt (the record's messages before the reply) would be blocked by the
   pre-filter or the reply fails the post-filter, checked on the text as written (``unsafe_rules`` counts
   ``prompt:<rule>`` and ``reply:<rule>``). Refusals are kept: they are the right answer to a harmful prompt the
   filters let through, and training data the model needs; they are counted (``refusals``) and marked.
4. **Snapshot contracts.** The record must pass ``parse_record`` under the snapshot's limits (``invalid`` by
   reason: too long, empty reply ...), so a curated source can never fail a snapshot build.
5. **Held out.** A record with a user turn equal (as ``loose_text``) to an eval-set prompt is dropped (``held_out``):
   production users pasting benchmark prompts must not leak them into training.
6. **PII scrubbed.** Every message (system, user, assistant, context included) goes through the redactor
   (``core.redact``: emails, phones, card numbers); a record whose text changed is kept and marked
   ``scrubbed``, and ``redactions`` counts the items replaced in the kept exchanges.
7. **Deduplicated.** By prompt key (``ChatRecord.prompt_key``, the normalized prompt the snapshot splits and checks
   leakage by) against ``existing`` (the current snapshot's and earlier curated files' prompts) and within the
   batch, the earliest reply winning: a curated record can never duplicate or leak into another split.

A dropped exchange (rules 2-5) ends its conversation: later exchanges would carry it as context, and are counted
``context_dropped``. Each candidate exchange gets exactly one outcome, so ``turns`` is the sum of ``not_completed``,
``malformed``, ``unsafe``, ``invalid``, ``held_out``, ``context_dropped``, ``duplicate`` and ``kept``.

Records carry ``metadata``: ``source: "curated"``, provenance as hashes (``conversation``, ``key``: never the raw
ids, let alone the secret), ``turn`` (1-based exchange), ``model_version`` (the version that wrote the reply),
``scrubbed`` and ``refusal``. Records are ordered by reply time, then conversation and turn, and carry nothing
that depends on when curation ran, so the same conversations give the same records and the same snapshot hash.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

from core.hashing import sha256_text
from core.redact import redact
from core.refusal import is_refusal
from core.turns import StoredTurn
from training.config import SnapshotConfig
from training.data.records import ChatRecord, Message, RecordInvalid, loose_text, parse_record

SOURCE = "curated"
COMPLETED = "ok"  # the request-log status of a reply the model finished and the filters passed
Scrubber = Callable[[str], tuple[str, dict[str, int]]]


class SafetyChecker(Protocol):
    """The safety filters curation applies: each method returns the name of the rule that blocks, or None."""

    def check_prompt(self, messages: Sequence[Message]) -> str | None:
        """Would the pre-filter block this prompt (system, earlier turns and the new user turn)?"""
        ...

    def check_reply(self, text: str) -> str | None:
        """Does this reply fail the post-filter?"""
        ...


SourceTurn = StoredTurn  # a stored message (core.turns): the serving store's shape, without importing it


@dataclass(frozen=True)
class SourceConversation:
    """A conversation with the consent facts of its key, as they stand at export time."""

    id: str
    key_id: str
    system: str | None
    opted_in: bool
    deleted: bool
    turns: tuple[SourceTurn, ...] = ()


def counts_json(report: Any) -> dict[str, Any]:
    """A curation report's fields as JSON: the counts, and each breakdown (rule -> count) in key order."""
    return {
        name: dict(sorted(value.items())) if isinstance(value, dict) else value for name, value in vars(report).items()
    }


@dataclass(frozen=True)
class CurationReport:
    """What curation read and why each candidate was kept or dropped (see the module docstring)."""

    read: int = 0
    not_opted_in: int = 0
    deleted: int = 0
    turns: int = 0
    not_completed: int = 0
    malformed: int = 0
    unsafe: int = 0
    invalid: int = 0
    held_out: int = 0
    context_dropped: int = 0
    duplicate: int = 0
    kept: int = 0
    scrubbed: int = 0
    refusals: int = 0
    unsafe_rules: dict[str, int] = field(default_factory=dict)
    invalid_reasons: dict[str, int] = field(default_factory=dict)
    redactions: dict[str, int] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return counts_json(self)


@dataclass(frozen=True)
class Curation:
    records: tuple[ChatRecord, ...]
    report: CurationReport

    def jsonl(self) -> str:
        """The records as a snapshot source file: one canonical JSON object per line."""
        return "".join(record.canonical() + "\n" for record in self.records)


def provenance_id(kind: str, raw: str) -> str:
    """The hash a curated record names its conversation or key by (``kind``: conversation, key)."""
    return sha256_text(f"chat-lifecycle/curated/{kind}\n{raw}")[:16]


def prompt_keys(records: Iterable[Mapping[str, Any]]) -> set[str]:
    """Prompt keys of records given as JSON objects (``Snapshot.records(split)``, a curated file's lines)."""
    return {ChatRecord(tuple(Message(m["role"], m["content"]) for m in r["messages"])).prompt_key for r in records}


@dataclass(frozen=True)
class _Exchange:
    index: int
    user: SourceTurn | None  # None: not exactly one user turn before the reply
    reply: SourceTurn


@dataclass
class _Context:
    """The conversation so far: as written (what the filters check) and scrubbed (what records hold)."""

    raw: list[Message] = field(default_factory=list)
    clean: list[Message] = field(default_factory=list)
    scrubbed: bool = False

    def add(self, role: str, text: str, clean: str) -> None:
        self.raw.append(Message(role, text))
        self.clean.append(Message(role, clean))
        self.scrubbed = self.scrubbed or clean != text


@dataclass(frozen=True)
class _Candidate:
    order: tuple[datetime, str, int]
    record: ChatRecord
    redactions: Counter[str]


@dataclass
class _Tally:
    counts: Counter[str] = field(default_factory=Counter)
    unsafe_rules: Counter[str] = field(default_factory=Counter)
    invalid_reasons: Counter[str] = field(default_factory=Counter)
    redactions: Counter[str] = field(default_factory=Counter)


def _exchanges(conv: SourceConversation) -> tuple[list[str], list[_Exchange]]:
    systems = [conv.system] if conv.system else []
    turns = list(conv.turns)
    start = 0
    while start < len(turns) and turns[start].role == "system":
        systems.append(turns[start].content)
        start += 1
    out: list[_Exchange] = []
    pending: list[SourceTurn] = []
    for turn in turns[start:]:
        if turn.role != "assistant":
            pending.append(turn)
            continue
        user = pending[0] if len(pending) == 1 and pending[0].role == "user" else None
        out.append(_Exchange(len(out) + 1, user, turn))
        pending = []
    return systems, out  # trailing turns without a reply are not an exchange


def _scrub(text: str, scrub: Scrubber) -> tuple[str, Counter[str]]:
    clean, counts = scrub(text)
    return clean, Counter({k: v for k, v in counts.items() if v})


def _conversation(
    conv: SourceConversation,
    *,
    checker: SafetyChecker,
    limits: SnapshotConfig,
    since: datetime | None,
    until: datetime | None,
    held_out: Collection[str],
    scrub: Scrubber,
    tally: _Tally,
) -> list[_Candidate]:
    systems, exchanges = _exchanges(conv)
    context = _Context()
    if systems:
        system = "\n\n".join(systems)
        context.add("system", system, _scrub(system, scrub)[0])
    dropped = False
    out: list[_Candidate] = []
    for ex in exchanges:
        at = ex.reply.created_at
        new = (since is None or at >= since) and (until is None or at < until)
        tally.counts["turns"] += new
        if dropped:
            tally.counts["context_dropped"] += new
            continue
        outcome, candidate = _exchange(conv, ex, context, checker, limits, held_out, scrub, tally, new)
        if outcome is not None:
            dropped = True
            tally.counts[outcome] += new
        elif new:
            assert candidate is not None
            out.append(candidate)
    return out


def _exchange(
    conv: SourceConversation,
    ex: _Exchange,
    context: _Context,
    checker: SafetyChecker,
    limits: SnapshotConfig,
    held_out: Collection[str],
    scrub: Scrubber,
    tally: _Tally,
    new: bool,
) -> tuple[str | None, _Candidate | None]:
    """(the reason the exchange is dropped, None) or (None, its candidate record, the exchange joining ``context``)."""
    if ex.user is None:
        return "malformed", None
    if ex.reply.status is not None and ex.reply.status != COMPLETED:
        return "not_completed", None
    rule = checker.check_prompt([*context.raw, Message("user", ex.user.content)])
    if rule is None:
        reply_rule = checker.check_reply(ex.reply.content)
        rule = None if reply_rule is None else f"reply:{reply_rule}"
    else:
        rule = f"prompt:{rule}"
    if rule is not None:
        tally.unsafe_rules[rule] += new
        return "unsafe", None
    user, user_counts = _scrub(ex.user.content, scrub)
    reply, reply_counts = _scrub(ex.reply.content, scrub)
    messages = [*context.clean, Message("user", user), Message("assistant", reply)]
    metadata = {
        "source": SOURCE,
        "conversation": provenance_id("conversation", conv.id),
        "key": provenance_id("key", conv.key_id),
        "turn": ex.index,
        "model_version": ex.reply.model_version,
        "scrubbed": context.scrubbed or user != ex.user.content or reply != ex.reply.content,
        "refusal": is_refusal(reply),
    }
    obj = {"messages": [{"role": m.role, "content": m.content} for m in messages], "metadata": metadata}
    try:
        record = parse_record(obj, limits)
    except RecordInvalid as exc:
        tally.invalid_reasons[exc.code] += new
        return "invalid", None
    if any(m.role == "user" and loose_text(m.content) in held_out for m in record.messages):
        return "held_out", None
    context.add("user", ex.user.content, user)
    context.add("assistant", ex.reply.content, reply)
    return None, _Candidate((ex.reply.created_at, conv.id, ex.index), record, user_counts + reply_counts)


def curate(
    conversations: Iterable[SourceConversation],
    *,
    checker: SafetyChecker,
    limits: SnapshotConfig,
    since: datetime | None = None,
    until: datetime | None = None,
    existing: Collection[str] = frozenset(),
    held_out: Collection[str] = frozenset(),
    scrub: Scrubber = redact,
) -> Curation:
    """Apply the rules of the module docstring; ``existing`` holds prompt keys (``prompt_keys``) already in the
    data, ``held_out`` the ``loose_text`` of eval prompts, ``[since, until)`` the window of replies to take."""
    tally = _Tally()
    candidates: list[_Candidate] = []
    for conv in conversations:
        tally.counts["read"] += 1
        if not conv.opted_in:
            tally.counts["not_opted_in"] += 1
        elif conv.deleted:
            tally.counts["deleted"] += 1
        else:
            candidates += _conversation(
                conv,
                checker=checker,
                limits=limits,
                since=since,
                until=until,
                held_out=held_out,
                scrub=scrub,
                tally=tally,
            )
    seen = set(existing)
    kept: list[ChatRecord] = []
    for candidate in sorted(candidates, key=lambda c: c.order):
        key = candidate.record.prompt_key
        if key in seen:
            tally.counts["duplicate"] += 1
            continue
        seen.add(key)
        kept.append(candidate.record)
        tally.redactions.update(candidate.redactions)
        tally.counts["scrubbed"] += bool(candidate.record.metadata["scrubbed"])
        tally.counts["refusals"] += bool(candidate.record.metadata["refusal"])
    c = tally.counts
    c["kept"] = len(kept)
    assert c["turns"] == sum(c[name] for name in _OUTCOMES), c
    report = CurationReport(
        **{name: c[name] for name in _COUNTS},
        unsafe_rules=dict(+tally.unsafe_rules),  # unary +: without the zero counts of exchanges outside the window
        invalid_reasons=dict(+tally.invalid_reasons),
        redactions=dict(+tally.redactions),
    )
    return Curation(tuple(kept), report)


_OUTCOMES = ("not_completed", "malformed", "unsafe", "invalid", "held_out", "context_dropped", "duplicate", "kept")
_COUNTS = ("read", "not_opted_in", "deleted", "turns", *_OUTCOMES, "scrubbed", "refusals")
