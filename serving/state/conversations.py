"""Conversations in the serving database, per tenant: every read or write takes the caller's key id, and a
conversation of another key, or a deleted one, is a ``NotFoundError`` exactly like one that never existed, so ids
leak nothing. The one exception is the operator's read for training curation (``training_conversations``): across
keys, but only the text of conversations whose key opted in and that were not deleted."""

from __future__ import annotations

import secrets
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa

from core.errors import DataError, NotFoundError
from core.redact import redact
from serving.state.database import Database, utc_now
from serving.state.retention import erase_log_texts
from serving.state.schema import (
    Conversation,
    StoredMessage,
    TrainingConversation,
    TrainingTurn,
    conversations_t,
    keys_t,
    log_t,
    messages_t,
    to_utc,
)

ROLES = frozenset({"system", "user", "assistant", "tool"})
_SAVED_STATUSES = ("ok", "content_filter")  # the request statuses whose turns the gateway saves to the conversation
_IN_CHUNK = 500  # ids per IN (...) list: far below SQLite's bound-parameter limit


def new_conversation_id() -> str:
    """A fresh conversation id (the gateway makes one before the traffic split, which hashes it)."""
    return "conv_" + secrets.token_hex(12)


class ConversationStore(Database):
    """The ``conversations`` and ``messages`` tables."""

    def create_conversation(
        self, key_id: str, model: str, system: str | None = None, *, conversation_id: str | None = None
    ) -> Conversation:
        """A new conversation; ``conversation_id`` is one made beforehand by ``new_conversation_id``."""
        now = utc_now()
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
        now = utc_now()
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
        """Soft delete: hidden from get and list at once, erased by ``purge_deleted`` after the retention period.
        Its texts in the request log (prompts, replies, errors, feedback) and the shadow log are erased at once, in
        the same transaction; their numeric rows stay for billing (``serving.state.retention``)."""
        with self._write() as conn:
            _owned(conn, key_id, conv_id)
            conn.execute(sa.update(conversations_t).where(conversations_t.c.id == conv_id).values(deleted_at=utc_now()))
            erase_log_texts(conn, sa.and_(log_t.c.conversation_id == conv_id, log_t.c.key_id == key_id))

    def purge_deleted(self, older_than: timedelta, now: datetime | None = None) -> int:
        """Erase conversations (and their messages) deleted more than ``older_than`` ago; returns how many."""
        cutoff = to_utc(now or utc_now()) - older_than
        doomed = sa.select(conversations_t.c.id).where(conversations_t.c.deleted_at < cutoff)
        with self._write() as conn:
            # explicit, not ON DELETE CASCADE: correct even on a SQLite connection without foreign keys
            conn.execute(sa.delete(messages_t).where(messages_t.c.conversation_id.in_(doomed)))
            return conn.execute(sa.delete(conversations_t).where(conversations_t.c.deleted_at < cutoff)).rowcount

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


def _conversation(row: sa.Row[Any]) -> Conversation:
    return Conversation(row.id, row.key_id, row.model, row.system, row.created_at, row.updated_at)
