"""The serving database's tables, and the frozen records ``ServingStore`` (``serving.state.store``) reads from them.

Portable column types only, so the same tables run on SQLite and on Postgres; every datetime column is a
``UtcDateTime`` (stored as UTC, handed back timezone-aware). Key id columns are plain indexed strings (no foreign key)
so a gateway running without keys can use one fixed tenant id. Records: ``ApiKey`` (api_keys), ``Conversation`` and
``StoredMessage`` (conversations, messages), ``UsageRow`` (usage_daily), ``RequestLogEntry`` (request_log),
``ShadowLogEntry`` (shadow_log), ``Feedback`` and ``TrainingFeedback`` (ratings of answers, on their request-log
rows), and ``TrainingConversation``/``TrainingTurn`` (conversations as training curation
reads them, across keys).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from typing import NotRequired, TypedDict

import sqlalchemy as sa

from core.turns import StoredTurn


class UtcDateTime(sa.TypeDecorator[datetime]):
    """Aware datetimes in, aware UTC datetimes out, on every backend.

    Postgres gets ``timestamptz``; SQLite has no time zone type, so values are stored as naive UTC text and
    compare correctly as strings. Naive datetimes are refused: their time zone would be a guess.
    """

    impl = sa.DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: sa.Dialect) -> datetime | None:
        if value is None:
            return None
        value = to_utc(value)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect: sa.Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def _storable(value: str | None) -> str | None:
    return value.replace("\x00", "\ufffd") if value is not None else None


class StoredText(sa.TypeDecorator[str]):
    """Text as every backend can store it: NUL characters become U+FFFD.

    PostgreSQL's text types cannot hold NUL (SQLite can), and a model's reply may contain one (a byte-level
    tokenizer decodes whatever the model emits; a client may send one): without this, the same answer that SQLite
    records would fail on Postgres, losing its conversation turn and its request-log row. The client still gets
    the reply as generated; the stored copy (conversation history, request log) has the replacement character.
    """

    impl = sa.Text
    cache_ok = True

    def process_bind_param(self, value: str | None, dialect: sa.Dialect) -> str | None:
        return _storable(value)


class StoredString(sa.TypeDecorator[str]):
    """``StoredText``'s NUL handling on a bounded string column (the model name a client sent)."""

    impl = sa.String
    cache_ok = True

    def process_bind_param(self, value: str | None, dialect: sa.Dialect) -> str | None:
        return _storable(value)


metadata = sa.MetaData()

keys_t = sa.Table(
    "api_keys",
    metadata,
    sa.Column("id", sa.String(32), primary_key=True),
    sa.Column("name", sa.String(200), nullable=False),
    sa.Column("prefix", sa.String(16), nullable=False),
    sa.Column("secret_sha256", sa.String(64), nullable=False, unique=True),
    sa.Column("created_at", UtcDateTime, nullable=False),
    sa.Column("revoked_at", UtcDateTime),
    sa.Column("requests_per_minute", sa.Integer),
    sa.Column("tokens_per_minute", sa.Integer),
    # NOT NULL with a server default, so ``ServingStore`` can add it in place to a database that lacks it
    sa.Column("training_opt_in", sa.Boolean, nullable=False, default=False, server_default=sa.false()),
    # names are unique among active keys only: a revoked key's name can be reused (partial index, both dialects)
    sa.Index(
        "ux_api_keys_active_name",
        "name",
        unique=True,
        sqlite_where=sa.text("revoked_at IS NULL"),
        postgresql_where=sa.text("revoked_at IS NULL"),
    ),
)

conversations_t = sa.Table(
    "conversations",
    metadata,
    sa.Column("id", sa.String(40), primary_key=True),
    sa.Column("key_id", sa.String(64), nullable=False),
    sa.Column("model", StoredString(200), nullable=False),
    sa.Column("system", StoredText),
    sa.Column("created_at", UtcDateTime, nullable=False),
    sa.Column("updated_at", UtcDateTime, nullable=False),
    sa.Column("deleted_at", UtcDateTime),
    sa.Index("ix_conversations_key_created", "key_id", "created_at"),
    sa.Index("ix_conversations_deleted_at", "deleted_at"),
)

messages_t = sa.Table(
    "messages",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("conversation_id", sa.String(40), sa.ForeignKey("conversations.id", ondelete="CASCADE"), nullable=False),
    sa.Column("seq", sa.Integer, nullable=False),
    sa.Column("role", sa.String(20), nullable=False),
    sa.Column("content", StoredText, nullable=False),
    sa.Column("model_version", sa.String(200)),
    sa.Column("created_at", UtcDateTime, nullable=False),
    # a blocked exchange ("pre:<rule>", "post:<rule>"): kept in the history, out of every later turn's context
    sa.Column("filtered", sa.String(200)),
    sa.Index("ux_messages_conversation_seq", "conversation_id", "seq", unique=True),
)

usage_t = sa.Table(
    "usage_daily",
    metadata,
    sa.Column("key_id", sa.String(64), primary_key=True),
    sa.Column("model", sa.String(200), primary_key=True),
    sa.Column("day", sa.Date, primary_key=True),
    sa.Column("requests", sa.Integer, nullable=False),
    sa.Column("prompt_tokens", sa.Integer, nullable=False),
    sa.Column("completion_tokens", sa.Integer, nullable=False),
    # added with cost accounting (serving.pipeline.cost): the requests' shares of their engines' busy time, priced
    sa.Column("cost_usd", sa.Float, nullable=False, server_default=sa.text("0")),
)

log_t = sa.Table(
    "request_log",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("request_id", sa.String(100), nullable=False, index=True),
    sa.Column("at", UtcDateTime, nullable=False, index=True),
    sa.Column("key_id", sa.String(64)),
    sa.Column("model", StoredString(200), nullable=False),
    sa.Column("model_version", sa.String(200)),
    sa.Column("alias", sa.String(200)),
    sa.Column("route", sa.String(40)),
    sa.Column("status", sa.String(40), nullable=False),
    sa.Column("http_status", sa.Integer, nullable=False),
    sa.Column("prompt_tokens", sa.Integer, nullable=False),
    sa.Column("completion_tokens", sa.Integer, nullable=False),
    sa.Column("ttft_ms", sa.Float),
    sa.Column("tpot_ms", sa.Float),
    sa.Column("e2e_ms", sa.Float),
    sa.Column("stream", sa.Boolean, nullable=False),
    sa.Column("pre_filter", sa.String(200)),
    sa.Column("post_filter", sa.String(200)),
    sa.Column("conversation_id", sa.String(40)),
    sa.Column("prompt_text", StoredText),
    sa.Column("response_text", StoredText),
    sa.Column("finish_reason", sa.String(40)),
    sa.Column("error", StoredText),
    sa.Column("redactions", sa.Integer, nullable=False),
    # added with progressive delivery (``ServingStore`` adds them to older databases on open)
    sa.Column("assigned_version", sa.String(200)),
    sa.Column("refusal", sa.Boolean),
    # added with production feedback (POST /v1/feedback): the latest rating of this answer by the key that asked
    # for it, +1 or -1, with an optional better answer and comment (both redacted like the prompt and reply);
    # ``context_turns``: messages the model saw before its reply (curation rebuilds a stateless prompt from
    # ``prompt_text`` only when it was the single one)
    sa.Column("context_turns", sa.Integer),
    sa.Column("feedback_rating", sa.SmallInteger),
    sa.Column("feedback_better", sa.Text),
    sa.Column("feedback_comment", sa.Text),
    sa.Column("feedback_at", UtcDateTime),
    # added with the classifier's feedback loop: why a thumbs down (serving.state.ratings.FEEDBACK_REASONS)
    sa.Column("feedback_reason", sa.String(40)),
    # added with the safety classifier: the version that judged the prompt (serving.safety.harm_filter)
    sa.Column("safety_classifier", sa.String(200)),
    # added with the classifier canary: the other version that judged the prompt in shadow while a canary ran, and
    # what it would have done (its rule, or "passed")
    sa.Column("safety_shadow_classifier", sa.String(200)),
    sa.Column("safety_shadow_rule", sa.String(200)),
    # added with cost accounting: this request's share of its engine's busy time, priced (serving.pipeline.cost)
    sa.Column("cost_usd", sa.Float),
    # added with the assistant turns a client writes: a digest of the reply as the client got it
    # (serving.safety.replies), so every replica, and the gateway after a restart, knows its replies
    sa.Column("reply_digest", sa.String(32)),
    sa.Index("ix_request_log_version_at", "model_version", "at"),
    sa.Index("ix_request_log_reply_digest", "reply_digest"),
    sa.Index("ix_request_log_feedback_at", "feedback_at"),
)

shadow_t = sa.Table(
    "shadow_log",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("request_id", sa.String(100), nullable=False, index=True),
    sa.Column("at", UtcDateTime, nullable=False, index=True),
    sa.Column("primary_version", sa.String(200), nullable=False),
    sa.Column("shadow_version", sa.String(200), nullable=False),
    sa.Column("status", sa.String(20), nullable=False),
    sa.Column("primary_tokens", sa.Integer, nullable=False),
    sa.Column("shadow_tokens", sa.Integer, nullable=False),
    sa.Column("length_ratio", sa.Float),
    sa.Column("primary_refusal", sa.Boolean, nullable=False),
    sa.Column("shadow_refusal", sa.Boolean, nullable=False),
    sa.Column("primary_toxicity", sa.Float),
    sa.Column("shadow_toxicity", sa.Float),
    sa.Column("similarity", sa.Float),
    sa.Column("primary_ttft_ms", sa.Float),
    sa.Column("shadow_ttft_ms", sa.Float),
    sa.Column("primary_e2e_ms", sa.Float),
    sa.Column("shadow_e2e_ms", sa.Float),
    sa.Column("error", StoredText),
    sa.Index("ix_shadow_log_version_at", "shadow_version", "at"),
)


@dataclass(frozen=True)
class ApiKey:
    """A key as listed and authenticated; the secret itself is never stored, only its SHA-256."""

    id: str
    name: str
    prefix: str
    created_at: datetime
    revoked_at: datetime | None = None
    requests_per_minute: int | None = None  # None: the serving.api_keys default
    tokens_per_minute: int | None = None
    training_opt_in: bool = False

    @property
    def active(self) -> bool:
        return self.revoked_at is None


class StoredMessage(TypedDict):
    role: str
    content: str
    created_at: datetime
    model_version: NotRequired[str]  # assistant turns only: the version that wrote it
    filtered: NotRequired[str]  # a blocked exchange: the stage and rule ("pre:injection.ignore_previous")


@dataclass(frozen=True)
class Conversation:
    """A conversation; ``messages`` is filled by ``get_conversation`` and left empty by ``list_conversations``."""

    id: str
    key_id: str
    model: str
    system: str | None
    created_at: datetime
    updated_at: datetime
    messages: list[StoredMessage] = field(default_factory=list)


TrainingTurn = StoredTurn  # one stored message, as curation reads it (core.turns)


@dataclass(frozen=True)
class TrainingConversation:
    """A conversation as training curation reads it (``ServingStore.training_conversations``).

    ``opted_in``: its key exists, is not revoked and has ``training_opt_in`` set, now; ``deleted``: it was deleted.
    ``turns`` holds every stored message in order, and is empty unless the conversation is opted in and not
    deleted: the text of the others never leaves the database.
    """

    id: str
    key_id: str
    system: str | None
    created_at: datetime
    opted_in: bool
    deleted: bool
    turns: tuple[TrainingTurn, ...] = ()


@dataclass(frozen=True)
class UsageRow:
    day: date
    model: str
    requests: int
    prompt_tokens: int
    completion_tokens: int
    cost_usd: float = 0.0  # the requests' shares of their engines' busy time, priced (serving.pipeline.cost)


@dataclass(frozen=True)
class RequestLogEntry:
    """One finished (or refused) request, as monitoring and rollout analysis read it.

    ``status`` is one of ok, content_filter, error, aborted, rate_limited...; ``route`` says which path answered
    (primary, canary, canary-unavailable, fallback, brownout, brownout-fallback; rejected: refused before
    routing); ``pre_filter``/``post_filter`` name the rule or category that blocked.
    ``redactions`` is set by ``log_request``: how many items ``redact`` replaced in the prompt and reply.
    ``assigned_version`` is the version the routing chose before any availability fallback: the traffic split's
    champion or canary for the served name (the canary's on ``canary-unavailable``, the champion's or canary's on
    ``fallback``), the named version otherwise; None on rows written before it existed. ``refusal``: the reply
    opens as a refusal (``core.refusal``), set on completed answers (status ok) only. ``cost_usd``: the request's
    share of its engine's busy time, priced (``serving.pipeline.cost``).
    """

    request_id: str
    at: datetime
    model: str
    status: str
    http_status: int
    key_id: str | None = None
    model_version: str | None = None
    alias: str | None = None
    route: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    ttft_ms: float | None = None
    tpot_ms: float | None = None
    e2e_ms: float | None = None
    stream: bool = False
    pre_filter: str | None = None
    post_filter: str | None = None
    conversation_id: str | None = None
    prompt_text: str | None = None
    response_text: str | None = None
    finish_reason: str | None = None
    error: str | None = None
    redactions: int = 0
    assigned_version: str | None = None
    refusal: bool | None = None
    context_turns: int | None = None
    feedback_rating: int | None = None
    feedback_better: str | None = None
    feedback_comment: str | None = None
    feedback_reason: str | None = None  # why a thumbs down: unsafe, wrong_refusal, incorrect or other
    feedback_at: datetime | None = None
    safety_classifier: str | None = None
    safety_shadow_classifier: str | None = None  # during a classifier canary: the version judging in shadow
    safety_shadow_rule: str | None = None  # what it would have done: its rule (classifier.<category>) or "passed"
    cost_usd: float | None = None  # None: before cost accounting, or never reached an engine's accounting
    reply_digest: str | None = None  # the reply as the client got it, hashed (serving.safety.replies)


@dataclass(frozen=True)
class Feedback:
    """A rating of one answer (``ServingStore.record_feedback``): what was stored, redacted."""

    response_id: str
    model_version: str | None
    rating: int  # +1 or -1
    better_answer: str | None
    comment: str | None
    at: datetime
    reason: str | None = None  # why a thumbs down (serving.state.ratings.FEEDBACK_REASONS)


@dataclass(frozen=True)
class TrainingFeedback:
    """One rated answer as training curation reads it (``ServingStore.training_feedback``), across keys.

    ``opted_in`` and ``deleted`` as for ``TrainingConversation`` (``deleted``: its conversation was deleted).
    ``prompt`` is the context the model answered (system, then alternating user/assistant turns, ending with the
    user turn), rebuilt from the stored conversation or, for a stateless request of one message, from the logged
    prompt; None when it cannot be rebuilt (a stateless request with earlier turns the log does not keep). The
    text fields are empty unless the row may be used (opted in, not deleted): they never leave the database.
    """

    response_id: str
    key_id: str
    conversation_id: str | None
    model_version: str | None
    status: str
    rating: int
    at: datetime  # when it was rated
    opted_in: bool
    deleted: bool
    prompt: tuple[tuple[str, str], ...] | None = None  # (role, content) pairs
    reply: str = ""
    better_answer: str | None = None
    pre_filter: str | None = None  # the pre-filter rule that refused it (``classifier.<category>``, ...), if any
    safety_classifier: str | None = None  # the classifier version that judged its prompt
    reason: str | None = None  # why a thumbs down: "unsafe" marks an answer that helped with harm


@dataclass(frozen=True)
class ShadowLogEntry:
    """One shadow comparison: the answer a user got (``primary_*``) and the shadow version's answer to the same
    request (same prompt tokens and sampling parameters), compared. No text of either is stored.

    ``status`` is the shadow call's: ok (both answers complete: the comparison fields are set) or error (the
    shadow failed: ``error`` says why, ``shadow_refusal`` is False and the comparison fields are None).
    ``length_ratio`` is shadow characters / primary characters (None for an empty primary answer);
    ``*_refusal`` from ``core.refusal.is_refusal``; ``*_toxicity`` the gateway's toxicity scorer (0..1);
    ``similarity`` the cosine of the two answers' sentence embeddings (None when disabled or unavailable).
    """

    request_id: str
    at: datetime
    primary_version: str
    shadow_version: str
    status: str
    primary_tokens: int = 0
    shadow_tokens: int = 0
    length_ratio: float | None = None
    primary_refusal: bool = False
    shadow_refusal: bool = False
    primary_toxicity: float | None = None
    shadow_toxicity: float | None = None
    similarity: float | None = None
    primary_ttft_ms: float | None = None
    shadow_ttft_ms: float | None = None
    primary_e2e_ms: float | None = None
    shadow_e2e_ms: float | None = None
    error: str | None = None


def to_utc(value: datetime) -> datetime:
    """``value`` in UTC; a naive datetime is refused (ValueError), since its time zone would be a guess."""
    if value.tzinfo is None:
        raise ValueError(f"naive datetime {value.isoformat()}: pass a timezone-aware datetime (UTC)")
    return value.astimezone(UTC)
