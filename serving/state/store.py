"""The gateway's persistent state: API keys, conversations, daily usage, the request log and the shadow log, on
SQLAlchemy Core.

One ``ServingStore(url)`` per gateway process, built in the app factory and closed on shutdown. The API is
synchronous (the gateway calls it from a thread pool). The same code runs on SQLite (the default,
``$LIFECYCLE_HOME/serving/serving.db``) and on ``postgresql+psycopg://`` URLs: no dialect-specific SQL, and the
portable tables of ``serving.state.schema``, whose records (``ApiKey``, ``Conversation``, ``RequestLogEntry`` ...) are
re-exported here. A database created by an older version gets the columns added since then on open
(``_add_missing_columns``: additive and idempotent, on both backends).

Tenancy: every conversation read or write takes the caller's key id; a conversation of another key, or one that
was deleted, raises ``NotFoundError`` exactly like one that never existed, so ids leak nothing. The one exception is
the operator's read for training curation (``training_conversations``): across keys, but only the text of
conversations whose key opted in (``training_opt_in``, ``lifecycle keys create NAME --training-opt-in``) and that
were not deleted.

Feedback (``record_feedback``, ``training_feedback``): a rating of an answer is stored on its request-log row, by
the key that asked only (``serving.state.ratings``); curation reads it across keys with the same consent rule.

Privacy: ``log_request`` redacts prompts and replies (``core.redact``) before writing, so the request log
that monitoring and training read never holds an email, phone or card number. Conversation history is kept as
written, because continuing a conversation needs it; deleting one hides it at once and ``purge_deleted`` erases it
after the retention period.

SQLite specifics (set on every connection): WAL journal (readers never block the writer), a busy timeout, foreign
keys on, and write transactions opened with ``BEGIN IMMEDIATE`` so that a read-then-write transaction queues on
the busy timeout instead of failing with "database is locked" when another writer got there first.
"""

from __future__ import annotations

import hashlib
import logging
import secrets
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, fields, replace
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.exc import ArgumentError, IntegrityError, NoSuchModuleError, SQLAlchemyError

from core.errors import ConfigError, DataError, NotFoundError
from core.redact import redact
from serving.state import ratings as feedback_log
from serving.state.schema import (
    ApiKey,
    Conversation,
    Feedback,
    RequestLogEntry,
    ShadowLogEntry,
    StoredMessage,
    TrainingConversation,
    TrainingFeedback,
    TrainingTurn,
    UsageRow,
    UtcDateTime,
    conversations_t,
    keys_t,
    log_t,
    messages_t,
    metadata,
    shadow_t,
    to_utc,
    usage_t,
)

__all__ = [
    "ROLES",
    "SQLITE_BUSY_TIMEOUT_MS",
    "ApiKey",
    "Conversation",
    "Feedback",
    "RequestLogEntry",
    "ServingStore",
    "ShadowLogEntry",
    "StoredMessage",
    "TrainingConversation",
    "TrainingFeedback",
    "TrainingTurn",
    "UsageRow",
    "UtcDateTime",
    "conversations_t",
    "keys_t",
    "log_t",
    "messages_t",
    "metadata",
    "new_conversation_id",
    "shadow_t",
    "usage_t",
]

log = logging.getLogger("lifecycle.serving")
SQLITE_BUSY_TIMEOUT_MS = 10_000
ROLES = frozenset({"system", "user", "assistant", "tool"})
_WRITE = "lc_write"  # execution option that makes the SQLite begin hook open a write transaction


_SAVED_STATUSES = ("ok", "content_filter")  # the request statuses whose turns the gateway saves to the conversation
_IN_CHUNK = 500  # ids per IN (...) list: far below SQLite's bound-parameter limit
_LOG_FIELDS = [c.name for c in log_t.columns if c.name != "id"]
_SHADOW_FIELDS = [c.name for c in shadow_t.columns if c.name != "id"]


def new_conversation_id() -> str:
    """A fresh conversation id (the gateway makes one before the traffic split, which hashes it)."""
    return "conv_" + secrets.token_hex(12)


class ServingStore:
    """Keys, conversations, usage and the request log on one SQLAlchemy engine (see the module docstring)."""

    def __init__(self, url: str) -> None:
        try:
            parsed = sa.make_url(url)
        except ArgumentError as exc:
            raise ConfigError(f"serving.database_url is not a database URL: {exc}") from exc
        shown = parsed.render_as_string(hide_password=True)
        is_sqlite = parsed.get_backend_name() == "sqlite"
        if is_sqlite and parsed.database and parsed.database != ":memory:" and not parsed.database.startswith("file:"):
            Path(parsed.database).expanduser().parent.mkdir(parents=True, exist_ok=True)
        try:
            engine = sa.create_engine(parsed, pool_pre_ping=not is_sqlite)
        except (ArgumentError, NoSuchModuleError, ImportError) as exc:
            raise ConfigError(f"serving.database_url {shown}: {exc}") from exc
        if is_sqlite:
            _configure_sqlite(engine)
        self._engine = engine
        self._writer = engine.execution_options(**{_WRITE: True})
        try:
            metadata.create_all(self._writer)
            added = _add_missing_columns(self._writer)
            added += _add_missing_indexes(self._writer)
        except SQLAlchemyError as exc:
            engine.dispose()
            raise ConfigError(f"cannot open the serving database {shown}: {exc}") from exc
        if added:
            log.info("serving database %s upgraded: added %s", shown, ", ".join(added))

    def close(self) -> None:
        self._engine.dispose()

    def __enter__(self) -> ServingStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def _read(self) -> Iterator[sa.Connection]:
        with self._engine.begin() as conn:
            yield conn

    @contextmanager
    def _write(self) -> Iterator[sa.Connection]:
        with self._writer.begin() as conn:
            yield conn

    # keys

    def create_key(
        self,
        name: str,
        *,
        requests_per_minute: int | None = None,
        tokens_per_minute: int | None = None,
        training_opt_in: bool = False,
    ) -> tuple[ApiKey, str]:
        """Create a key; returns it with its secret, which is shown this once and never stored."""
        name = name.strip()
        if not name:
            raise ConfigError("a key needs a non-empty name")
        for label, value in (("requests_per_minute", requests_per_minute), ("tokens_per_minute", tokens_per_minute)):
            if value is not None and value < 1:
                raise ConfigError(f"{label} must be >= 1, got {value}")
        secret = "lc-" + secrets.token_urlsafe(30)  # 30 bytes -> 40 url-safe characters
        key = ApiKey(
            id="key_" + secrets.token_hex(6),
            name=name,
            prefix=secret[:8],
            created_at=_now(),
            requests_per_minute=requests_per_minute,
            tokens_per_minute=tokens_per_minute,
            training_opt_in=training_opt_in,
        )
        try:
            with self._write() as conn:
                if conn.execute(sa.select(keys_t.c.id).where(_active_named(name))).first() is not None:
                    raise ConfigError(f"an active key named {name!r} already exists; revoke it or pick another name")
                conn.execute(sa.insert(keys_t).values(secret_sha256=_sha256(secret), **asdict(key)))
        except IntegrityError as exc:  # a concurrent create won the partial unique index
            raise ConfigError(f"an active key named {name!r} already exists") from exc
        return key, secret

    def list_keys(self, include_revoked: bool = False) -> list[ApiKey]:
        query = sa.select(keys_t).order_by(keys_t.c.created_at, keys_t.c.id)
        if not include_revoked:
            query = query.where(keys_t.c.revoked_at.is_(None))
        with self._read() as conn:
            return [_key(r) for r in conn.execute(query)]

    def revoke_key(self, id_or_name: str) -> ApiKey:
        """Revoke by id (idempotent: an already revoked key is returned as it is) or by active key name."""
        with self._write() as conn:
            row = conn.execute(sa.select(keys_t).where(keys_t.c.id == id_or_name)).first()
            row = row or conn.execute(sa.select(keys_t).where(_active_named(id_or_name))).first()
            if row is None:
                raise NotFoundError(f"no key {id_or_name!r} (neither an id nor the name of an active key)")
            key = _key(row)
            if key.revoked_at is None:
                key = replace(key, revoked_at=_now())
                conn.execute(sa.update(keys_t).where(keys_t.c.id == key.id).values(revoked_at=key.revoked_at))
            return key

    def set_training_opt_in(self, id_or_name: str, opt_in: bool) -> ApiKey:
        """Opt a key's conversations in to (or out of) training curation, by id or active key name.

        Curation reads the flag when it exports, and withdraws what it exported earlier from a key that opted out.
        """
        with self._write() as conn:
            row = conn.execute(sa.select(keys_t).where(keys_t.c.id == id_or_name)).first()
            row = row or conn.execute(sa.select(keys_t).where(_active_named(id_or_name))).first()
            if row is None:
                raise NotFoundError(f"no key {id_or_name!r} (neither an id nor the name of an active key)")
            key = replace(_key(row), training_opt_in=opt_in)
            conn.execute(sa.update(keys_t).where(keys_t.c.id == key.id).values(training_opt_in=opt_in))
            return key

    def authenticate(self, secret: str) -> ApiKey | None:
        """The active key whose secret this is, else None (looked up by hash: timing tells nothing of the secret)."""
        digest = _sha256(secret)
        with self._read() as conn:
            row = conn.execute(sa.select(keys_t).where(keys_t.c.secret_sha256 == digest)).first()
        if row is None or row.revoked_at is not None:
            return None
        return _key(row)

    # conversations

    def create_conversation(
        self, key_id: str, model: str, system: str | None = None, *, conversation_id: str | None = None
    ) -> Conversation:
        """A new conversation; ``conversation_id`` is one made beforehand by ``new_conversation_id``."""
        now = _now()
        conv = Conversation(conversation_id or new_conversation_id(), key_id, model, system, now, now)
        with self._write() as conn:
            conn.execute(
                sa.insert(conversations_t).values(
                    id=conv.id, key_id=key_id, model=model, system=system, created_at=now, updated_at=now
                )
            )
        return conv

    def get_conversation(self, key_id: str, conv_id: str) -> Conversation:
        with self._read() as conn:
            conv = _conversation(_owned(conn, key_id, conv_id))
            rows = conn.execute(
                sa.select(messages_t).where(messages_t.c.conversation_id == conv_id).order_by(messages_t.c.seq)
            ).all()
        for r in rows:
            msg = StoredMessage(role=r.role, content=r.content, created_at=r.created_at)
            if r.model_version is not None:
                msg["model_version"] = r.model_version
            if r.filtered is not None:
                msg["filtered"] = r.filtered
            conv.messages.append(msg)
        return conv

    def append_messages(
        self, key_id: str, conv_id: str, messages: Sequence[Mapping[str, Any]], model_version: str | None
    ) -> None:
        """Append turns in order; ``model_version`` is recorded on the assistant turns among them, a message's
        ``filtered`` (the stage and rule that blocked its exchange) on it."""
        for m in messages:
            if m.get("role") not in ROLES or not isinstance(m.get("content"), str):
                raise DataError(f"a message needs a role in {sorted(ROLES)} and string content, got {dict(m)!r}")
        now = _now()
        with self._write() as conn:  # BEGIN IMMEDIATE on SQLite, a row lock on Postgres: seq cannot race
            _owned(conn, key_id, conv_id, lock=True)
            last = conn.execute(sa.select(sa.func.max(messages_t.c.seq)).where(messages_t.c.conversation_id == conv_id))
            seq = (last.scalar() or 0) + 1
            if messages:
                conn.execute(
                    sa.insert(messages_t),
                    [
                        {
                            "conversation_id": conv_id,
                            "seq": seq + i,
                            "role": m["role"],
                            "content": m["content"],
                            "model_version": model_version if m["role"] == "assistant" else None,
                            "created_at": now,
                            "filtered": m.get("filtered"),
                        }
                        for i, m in enumerate(messages)
                    ],
                )
            conn.execute(sa.update(conversations_t).where(conversations_t.c.id == conv_id).values(updated_at=now))

    def list_conversations(self, key_id: str, limit: int = 20, before: str | None = None) -> list[Conversation]:
        """The key's conversations, newest first; ``before`` is the last id of the previous page."""
        c = conversations_t.c
        query = sa.select(conversations_t).where(c.key_id == key_id, c.deleted_at.is_(None))
        with self._read() as conn:
            if before is not None:
                cursor = conn.execute(sa.select(c.created_at).where(c.id == before, c.key_id == key_id)).first()
                if cursor is None:
                    raise NotFoundError(f"no conversation {before}")
                query = query.where(
                    sa.or_(c.created_at < cursor.created_at, sa.and_(c.created_at == cursor.created_at, c.id < before))
                )
            query = query.order_by(c.created_at.desc(), c.id.desc()).limit(limit)
            return [_conversation(r) for r in conn.execute(query)]

    def delete_conversation(self, key_id: str, conv_id: str) -> None:
        """Soft delete: hidden from get and list at once, erased by ``purge_deleted`` after the retention period."""
        with self._write() as conn:
            _owned(conn, key_id, conv_id)
            conn.execute(sa.update(conversations_t).where(conversations_t.c.id == conv_id).values(deleted_at=_now()))

    def purge_deleted(self, older_than: timedelta, now: datetime | None = None) -> int:
        """Erase conversations (and their messages) deleted more than ``older_than`` ago; returns how many."""
        cutoff = to_utc(now or _now()) - older_than
        doomed = sa.select(conversations_t.c.id).where(conversations_t.c.deleted_at < cutoff)
        with self._write() as conn:
            # explicit, not ON DELETE CASCADE: correct even on a SQLite connection without foreign keys
            conn.execute(sa.delete(messages_t).where(messages_t.c.conversation_id.in_(doomed)))
            return conn.execute(sa.delete(conversations_t).where(conversations_t.c.deleted_at < cutoff)).rowcount

    # training curation

    def training_conversations(
        self, since: datetime | None = None, until: datetime | None = None
    ) -> list[TrainingConversation]:
        """Every conversation, of any key, with an assistant turn written in ``[since, until)``, ordered by id.

        An operator's read for training curation, never on a request path. Each conversation says whether it may be
        used now (``opted_in``, ``deleted``); only those that may carry their turns: the whole history (earlier
        turns are the context of the new ones), each assistant turn with the status of the request-log row that
        recorded it. A row is matched to a turn by its reply text (the log holds it redacted), in order, so replies
        the gateway wrote itself (a pre-filter refusal, a stopped reply: status ``content_filter``) are told apart
        from completed answers (``ok``).
        """
        c, m, k = conversations_t.c, messages_t.c, keys_t.c
        in_window = sa.select(m.conversation_id).where(m.role == "assistant")
        if since is not None:
            in_window = in_window.where(m.created_at >= to_utc(since))
        if until is not None:
            in_window = in_window.where(m.created_at < to_utc(until))
        query = (
            sa.select(c.id, c.key_id, c.system, c.created_at, c.deleted_at, k.revoked_at, k.training_opt_in)
            .select_from(conversations_t.outerjoin(keys_t, k.id == c.key_id))
            .where(c.id.in_(in_window.distinct()))
            .order_by(c.id)
        )
        with self._read() as conn:
            rows = conn.execute(query).all()
            usable = [r.id for r in rows if r.deleted_at is None and r.revoked_at is None and bool(r.training_opt_in)]
            turns = _training_turns(conn, usable)
        return [
            TrainingConversation(
                id=r.id,
                key_id=r.key_id,
                system=r.system,
                created_at=r.created_at,
                opted_in=r.revoked_at is None and bool(r.training_opt_in),  # NULL: no such key
                deleted=r.deleted_at is not None,
                turns=turns.get(r.id, ()),
            )
            for r in rows
        ]

    def training_conversation_ids(self) -> set[str]:
        """Ids of the conversations that may be trained on now: not deleted, of an active key that opted in."""
        c, k = conversations_t.c, keys_t.c
        query = (
            sa.select(c.id)
            .join(keys_t, k.id == c.key_id)
            .where(c.deleted_at.is_(None), k.revoked_at.is_(None), k.training_opt_in.is_(True))
        )
        with self._read() as conn:
            return set(conn.execute(query).scalars())

    # usage

    def record_usage(
        self, key_id: str, model: str, prompt_tokens: int, completion_tokens: int, at: datetime | None = None
    ) -> None:
        """Add one request to the key's (model, UTC day) totals.

        Portable upsert: ``UPDATE ... SET n = n + :x`` (atomic per row on every backend); if no row matched,
        INSERT. Two first requests of a day racing to insert collide on the primary key; the loser retries and
        takes the UPDATE path. On SQLite the write transaction is IMMEDIATE, so the race cannot even happen.
        """
        self._usage_and_log(key_id, model, prompt_tokens, completion_tokens, at, None)

    def log_answer(self, entry: RequestLogEntry) -> RequestLogEntry:
        """``record_usage`` (on the entry's key, version and tokens) and ``log_request`` in one transaction: a
        process killed mid-way leaves both or neither, so usage always adds up to the request log."""
        if entry.key_id is None or entry.model_version is None:
            raise DataError(f"an answer's usage needs its key and version ({entry.request_id})")
        stored = self._usage_and_log(
            entry.key_id, entry.model_version, entry.prompt_tokens, entry.completion_tokens, entry.at, entry
        )
        assert stored is not None
        return stored

    def _usage_and_log(
        self,
        key_id: str,
        model: str,
        prompt_tokens: int,
        completion_tokens: int,
        at: datetime | None,
        entry: RequestLogEntry | None,
    ) -> RequestLogEntry | None:
        if prompt_tokens < 0 or completion_tokens < 0:
            raise DataError(f"token counts must be >= 0 ({prompt_tokens}, {completion_tokens})")
        day = to_utc(at or _now()).date()
        c = usage_t.c
        row = sa.and_(c.key_id == key_id, c.model == model, c.day == day)
        bump = {
            "requests": c.requests + 1,
            "prompt_tokens": c.prompt_tokens + prompt_tokens,
            "completion_tokens": c.completion_tokens + completion_tokens,
        }
        stored = _redacted(entry) if entry is not None else None
        for attempt in range(3):
            try:
                with self._write() as conn:
                    if conn.execute(sa.update(usage_t).where(row).values(bump)).rowcount == 0:
                        first = {"requests": 1, "prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens}
                        conn.execute(sa.insert(usage_t).values(key_id=key_id, model=model, day=day, **first))
                    if stored is not None:
                        conn.execute(sa.insert(log_t).values({f: getattr(stored, f) for f in _LOG_FIELDS}))
                return stored
            except IntegrityError:
                if attempt == 2:
                    raise
        raise AssertionError("unreachable: the last attempt returns or raises")

    def usage(self, key_id: str, start: date | None = None, end: date | None = None) -> list[UsageRow]:
        """Daily totals per model for one key, ``start`` and ``end`` inclusive (UTC days), oldest first."""
        c = usage_t.c
        query = sa.select(c.day, c.model, c.requests, c.prompt_tokens, c.completion_tokens).where(c.key_id == key_id)
        if start is not None:
            query = query.where(c.day >= start)
        if end is not None:
            query = query.where(c.day <= end)
        with self._read() as conn:
            return [UsageRow(*r) for r in conn.execute(query.order_by(c.day, c.model))]

    # request log

    def log_request(self, entry: RequestLogEntry) -> RequestLogEntry:
        """Write one entry with its prompt and reply redacted; returns what was stored."""
        stored = _redacted(entry)
        with self._write() as conn:
            conn.execute(sa.insert(log_t).values({f: getattr(stored, f) for f in _LOG_FIELDS}))
        return stored

    def request_log(
        self, since: datetime | None = None, model_version: str | None = None, limit: int | None = None
    ) -> list[RequestLogEntry]:
        """Entries at or after ``since``, oldest first; with ``limit``, the most recent ``limit`` of them."""
        c = log_t.c
        query = sa.select(*[c[f] for f in _LOG_FIELDS])
        if since is not None:
            query = query.where(c.at >= to_utc(since))
        if model_version is not None:
            query = query.where(c.model_version == model_version)
        query = query.order_by(c.at.desc(), c.id.desc())
        if limit is not None:
            query = query.limit(limit)
        with self._read() as conn:
            rows = conn.execute(query).all()
        return [RequestLogEntry(**r._asdict()) for r in reversed(rows)]

    # feedback

    def record_feedback(
        self, key_id: str, response_id: str, rating: int, better_answer: str | None = None, comment: str | None = None
    ) -> Feedback:
        """Rate the key's answer ``response_id`` (+1/-1), with an optional better answer and comment, on its
        request-log row; NotFoundError for another key's or an unknown id, DataError for a request without an
        answer (``serving.state.ratings``)."""
        with self._write() as conn:
            return feedback_log.record(conn, key_id, response_id, rating, better_answer, comment, _now())

    def training_feedback(self, until: datetime | None = None) -> list[TrainingFeedback]:
        """Every rated answer (rated before ``until``), across keys, for training curation: only those of keys
        opted in now, outside deleted conversations, carry their text (``serving.state.ratings.training_rows``)."""
        with self._read() as conn:
            return feedback_log.training_rows(conn, until)

    # shadow log

    def log_shadow(self, entry: ShadowLogEntry) -> ShadowLogEntry:
        """Write one shadow comparison (it holds no text); returns what was stored."""
        stored = replace(entry, at=to_utc(entry.at))
        with self._write() as conn:
            conn.execute(sa.insert(shadow_t).values({f: getattr(stored, f) for f in _SHADOW_FIELDS}))
        return stored

    def shadow_log(
        self, since: datetime | None = None, shadow_version: str | None = None, limit: int | None = None
    ) -> list[ShadowLogEntry]:
        """Comparisons at or after ``since``, oldest first; with ``limit``, the most recent ``limit`` of them."""
        c = shadow_t.c
        query = sa.select(*[c[f] for f in _SHADOW_FIELDS])
        if since is not None:
            query = query.where(c.at >= to_utc(since))
        if shadow_version is not None:
            query = query.where(c.shadow_version == shadow_version)
        query = query.order_by(c.at.desc(), c.id.desc())
        if limit is not None:
            query = query.limit(limit)
        with self._read() as conn:
            rows = conn.execute(query).all()
        return [ShadowLogEntry(**r._asdict()) for r in reversed(rows)]


def _add_missing_columns(engine: sa.Engine) -> list[str]:
    """Bring tables created by an older version up to ``metadata``: add the columns they lack.

    ``create_all`` creates missing tables but never alters existing ones. Only additive columns are ever introduced,
    nullable or NOT NULL with a server default (which fills the rows already there: ``api_keys.training_opt_in``
    is false on every older key), so a plain ``ALTER TABLE ... ADD COLUMN`` with the column's own DDL (the same
    statement on SQLite and Postgres) is the whole migration; it is idempotent (columns present are skipped), and
    a replica that loses a race to add the same column re-reads the table instead of failing. Returns
    ``table.column`` of each column added.
    """
    added: list[str] = []
    quote = engine.dialect.identifier_preparer.quote
    for table in metadata.sorted_tables:
        inspector = sa.inspect(engine)
        if not inspector.has_table(table.name):
            continue
        present = {c["name"] for c in inspector.get_columns(table.name)}
        for column in table.columns:
            if column.name in present:
                continue
            assert column.nullable or column.server_default is not None, (
                f"{table.name}.{column.name}: only nullable columns or ones with a server default can be added in place"
            )
            spec = sa.schema.CreateColumn(column).compile(dialect=engine.dialect)  # name, type, default, NOT NULL
            ddl = f"ALTER TABLE {quote(table.name)} ADD COLUMN {spec}"
            try:
                with engine.begin() as conn:
                    conn.exec_driver_sql(ddl)
            except SQLAlchemyError:
                if column.name not in {c["name"] for c in sa.inspect(engine).get_columns(table.name)}:
                    raise
                continue  # another process added it meanwhile
            added.append(f"{table.name}.{column.name}")
    return added


def _add_missing_indexes(engine: sa.Engine) -> list[str]:
    """Create the indexes of ``metadata`` that tables created by an older version lack (``create_all`` skips
    existing tables); ``CREATE INDEX`` after checking, and a lost race re-checked, like ``_add_missing_columns``."""
    added: list[str] = []
    for table in metadata.sorted_tables:
        inspector = sa.inspect(engine)
        if not inspector.has_table(table.name):
            continue
        present = {i["name"] for i in inspector.get_indexes(table.name)}
        for index in table.indexes:
            if index.name in present:
                continue
            try:
                index.create(engine)
            except SQLAlchemyError:
                if index.name not in {i["name"] for i in sa.inspect(engine).get_indexes(table.name)}:
                    raise
                continue
            added.append(f"{table.name}.{index.name}")
    return added


def _training_turns(conn: sa.Connection, conv_ids: Sequence[str]) -> dict[str, tuple[TrainingTurn, ...]]:
    """The messages of ``conv_ids``, assistant turns with their request-log status (see ``training_conversations``)."""
    m, lg = messages_t.c, log_t.c
    messages: dict[str, list[sa.Row[Any]]] = {}
    logged: dict[str, list[tuple[str | None, str]]] = {}
    for start in range(0, len(conv_ids), _IN_CHUNK):
        chunk = conv_ids[start : start + _IN_CHUNK]
        for r in conn.execute(sa.select(messages_t).where(m.conversation_id.in_(chunk)).order_by(m.seq)):
            messages.setdefault(r.conversation_id, []).append(r)
        log_rows = conn.execute(
            sa.select(lg.conversation_id, lg.response_text, lg.status)
            .where(lg.conversation_id.in_(chunk), lg.status.in_(_SAVED_STATUSES))
            .order_by(lg.at, lg.id)
        )
        for r in log_rows:
            logged.setdefault(r.conversation_id, []).append((r.response_text, r.status))
    out: dict[str, tuple[TrainingTurn, ...]] = {}
    for conv_id, rows in messages.items():
        pending = logged.get(conv_id, [])
        turns = []
        for r in rows:
            status = None
            if r.role == "assistant":
                stored = redact(r.content)[0]  # what log_request wrote for this reply
                match = next((i for i, (text, _) in enumerate(pending) if (text or "") == stored), None)
                if match is not None:
                    status = pending.pop(match)[1]
            turns.append(TrainingTurn(r.role, r.content, r.created_at, r.model_version, status))
        out[conv_id] = tuple(turns)
    return out


def _redacted(entry: RequestLogEntry) -> RequestLogEntry:
    """A request-log entry as it is stored: prompt and reply redacted (``core.redact``), time in UTC."""
    prompt, p_counts = redact(entry.prompt_text) if entry.prompt_text else (entry.prompt_text, {})
    response, r_counts = redact(entry.response_text) if entry.response_text else (entry.response_text, {})
    return replace(
        entry,
        at=to_utc(entry.at),
        prompt_text=prompt,
        response_text=response,
        redactions=sum(p_counts.values()) + sum(r_counts.values()),
    )


def _configure_sqlite(engine: sa.Engine) -> None:
    """Pragmas on every new connection, and SQLAlchemy (not the sqlite3 module) in charge of BEGIN."""

    @sa.event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        dbapi_conn.isolation_level = None  # the begin hook below emits BEGIN; sqlite3's own is unreliable
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
        cur.execute("PRAGMA foreign_keys=ON")
        cur.execute("PRAGMA synchronous=NORMAL")  # durable across process crashes in WAL mode; fsyncs less
        cur.close()

    @sa.event.listens_for(engine, "begin")
    def _on_begin(conn: sa.Connection) -> None:
        conn.exec_driver_sql("BEGIN IMMEDIATE" if conn.get_execution_options().get(_WRITE) else "BEGIN")


def _owned(conn: sa.Connection, key_id: str, conv_id: str, *, lock: bool = False) -> sa.Row[Any]:
    """The conversation row if it belongs to ``key_id`` and is not deleted; NotFoundError otherwise."""
    c = conversations_t.c
    query = sa.select(conversations_t).where(c.id == conv_id, c.key_id == key_id, c.deleted_at.is_(None))
    if lock:
        query = query.with_for_update()  # Postgres row lock; SQLite ignores it (BEGIN IMMEDIATE already locks)
    row = conn.execute(query).first()
    if row is None:
        raise NotFoundError(f"no conversation {conv_id}")
    return row


def _active_named(name: str) -> Any:
    return sa.and_(keys_t.c.name == name, keys_t.c.revoked_at.is_(None))


def _key(row: sa.Row[Any]) -> ApiKey:
    return ApiKey(**{f.name: getattr(row, f.name) for f in fields(ApiKey)})


def _conversation(row: sa.Row[Any]) -> Conversation:
    return Conversation(row.id, row.key_id, row.model, row.system, row.created_at, row.updated_at)


def _sha256(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def _now() -> datetime:
    return datetime.now(UTC)
