"""Ratings of answers, stored on their request-log rows: the SQL behind ``ServingStore.record_feedback`` (the
``POST /v1/feedback`` route) and ``ServingStore.training_feedback`` (training curation's read of it).

A rating belongs to the request-log row(s) of one response id (a chat completion's ``id`` is its request id).
Only the key that asked for the answer may rate it: a response of another key, or one that never existed, is a
``NotFoundError`` alike, so ids leak nothing. Only answers can be rated (status ok, or content_filter: a refusal
or stopped reply the client saw); a request that failed or was refused before generation is a ``DataError``.
Rating again replaces the earlier rating (the latest is what the user means), and its time. The better answer and
the comment are redacted (``core.redact``) before they are written, like every text of the request log.

Functions take an open connection: the store owns transactions (``serving.state.store``).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

import sqlalchemy as sa

from core.errors import DataError, NotFoundError
from core.redact import redact
from serving.state.database import Database, utc_now
from serving.state.schema import Feedback, TrainingFeedback, conversations_t, keys_t, log_t, messages_t, to_utc

RATEABLE = ("ok", "content_filter")  # answers the client saw (the statuses whose turns a conversation keeps)
# why a thumbs down, when the client says: "unsafe" (the answer helped with something harmful: its prompt is
# proposed to the safety classifier's next snapshot), "wrong_refusal" (refused a fair request), "incorrect", "other"
FEEDBACK_REASONS = ("unsafe", "wrong_refusal", "incorrect", "other")
_IN_CHUNK = 500


def record(
    conn: sa.Connection,
    key_id: str,
    response_id: str,
    rating: int,
    better_answer: str | None,
    comment: str | None,
    now: datetime,
    reason: str | None = None,
) -> Feedback:
    """Store ``rating`` (+1/-1) on the key's answer ``response_id`` (see the module docstring)."""
    if rating not in (1, -1):
        raise DataError(f"a rating is 1 (thumbs up) or -1 (thumbs down), got {rating!r}")
    if reason is not None and (reason not in FEEDBACK_REASONS or rating != -1):
        raise DataError(f"a reason ({', '.join(FEEDBACK_REASONS)}) goes with a thumbs down, got {reason!r}")
    c = log_t.c
    rows = conn.execute(
        sa.select(c.id, c.status, c.model_version).where(
            c.request_id == response_id, c.key_id == key_id, sa.or_(c.route.is_(None), c.route != "rejected")
        )
    ).all()
    if not rows:
        raise NotFoundError(f"no response {response_id!r} of this key")
    answered = [r for r in rows if r.status in RATEABLE]
    if not answered:
        raise DataError(f"response {response_id!r} has no answer to rate (its request ended as {rows[0].status})")
    better = redact(better_answer)[0] if better_answer else None
    note = redact(comment)[0] if comment else None
    at = to_utc(now)
    conn.execute(
        sa.update(log_t)
        .where(c.id.in_([r.id for r in answered]))
        .values(
            feedback_rating=rating,
            feedback_better=better,
            feedback_comment=note,
            feedback_at=at,
            feedback_reason=reason,
        )
    )
    return Feedback(response_id, answered[0].model_version, rating, better, note, at, reason)


def training_rows(conn: sa.Connection, until: datetime | None) -> list[TrainingFeedback]:
    """Every rated answer rated before ``until`` (all when None), of any key, ordered by rating time.

    Consent as ``ServingStore.training_conversations`` reads it: the key active and opted in now, the conversation
    (if any) not deleted or purged. Only rows that may be used carry their text and prompt."""
    lg, k, cv = log_t.c, keys_t.c, conversations_t.c
    query = (
        sa.select(
            lg.id,
            lg.request_id,
            lg.key_id,
            lg.conversation_id,
            lg.model_version,
            lg.status,
            lg.prompt_text,
            lg.response_text,
            lg.context_turns,
            lg.feedback_rating,
            lg.feedback_better,
            lg.feedback_at,
            lg.feedback_reason,
            lg.pre_filter,
            lg.safety_classifier,
            k.revoked_at,
            k.training_opt_in,
            cv.id.label("conv_found"),
            cv.deleted_at,
        )
        .select_from(log_t.outerjoin(keys_t, k.id == lg.key_id).outerjoin(conversations_t, cv.id == lg.conversation_id))
        .where(lg.feedback_rating.is_not(None))
        .order_by(lg.feedback_at, lg.id)
    )
    if until is not None:
        query = query.where(lg.feedback_at < to_utc(until))
    rows = conn.execute(query).all()

    def usable(r: sa.Row[Any]) -> bool:
        return _opted_in(r) and not _deleted(r)

    prompts = _conversation_prompts(conn, [r for r in rows if usable(r) and r.conversation_id])
    out = []
    for r in rows:
        fields: dict[str, Any] = {}
        if usable(r):
            prompt = prompts.get(r.id) if r.conversation_id else _stateless_prompt(r)
            fields = {"prompt": prompt, "reply": r.response_text or "", "better_answer": r.feedback_better}
        out.append(
            TrainingFeedback(
                response_id=r.request_id,
                key_id=r.key_id or "",
                conversation_id=r.conversation_id,
                model_version=r.model_version,
                status=r.status,
                rating=r.feedback_rating,
                at=r.feedback_at,
                opted_in=_opted_in(r),
                deleted=_deleted(r),
                pre_filter=r.pre_filter,
                safety_classifier=r.safety_classifier,
                reason=r.feedback_reason,
                **fields,
            )
        )
    return out


def _opted_in(r: sa.Row[Any]) -> bool:
    return r.revoked_at is None and bool(r.training_opt_in)  # NULL opt-in: no such key


def _deleted(r: sa.Row[Any]) -> bool:
    return r.conversation_id is not None and (r.conv_found is None or r.deleted_at is not None)


def _stateless_prompt(r: sa.Row[Any]) -> tuple[tuple[str, str], ...] | None:
    """The prompt of a request without a stored conversation: the logged user turn, if it was the only message."""
    if r.context_turns == 1 and r.prompt_text:
        return (("user", r.prompt_text),)
    return None


def _conversation_prompts(conn: sa.Connection, rows: Sequence[sa.Row[Any]]) -> dict[int, tuple[tuple[str, str], ...]]:
    """Log row id -> the conversation's context before the reply that row recorded (system prompt, then the turns
    the model saw: blocked exchanges are left out, as ``serving.pipeline.gateway`` leaves them out of every later
    context).

    A row is matched to its stored reply by text (the log holds it redacted), in order, as
    ``ServingStore.training_conversations`` matches them; a row without a matching reply gets no prompt."""
    wanted: dict[str, set[int]] = {}
    for r in rows:
        wanted.setdefault(r.conversation_id, set()).add(r.id)
    conv_ids = sorted(wanted)
    out: dict[int, tuple[tuple[str, str], ...]] = {}
    m, lg, cv = messages_t.c, log_t.c, conversations_t.c
    for start in range(0, len(conv_ids), _IN_CHUNK):
        chunk = conv_ids[start : start + _IN_CHUNK]
        systems: dict[str, str | None] = {
            r.id: r.system for r in conn.execute(sa.select(cv.id, cv.system).where(cv.id.in_(chunk)))
        }
        messages: dict[str, list[sa.Row[Any]]] = {}
        for r in conn.execute(sa.select(messages_t).where(m.conversation_id.in_(chunk)).order_by(m.seq)):
            messages.setdefault(r.conversation_id, []).append(r)
        logged: dict[str, list[tuple[int, str]]] = {}
        log_rows = conn.execute(
            sa.select(lg.id, lg.conversation_id, lg.response_text)
            .where(lg.conversation_id.in_(chunk), lg.status.in_(RATEABLE))
            .order_by(lg.at, lg.id)
        )
        for r in log_rows:
            logged.setdefault(r.conversation_id, []).append((r.id, r.response_text or ""))
        for conv_id in chunk:
            pending = logged.get(conv_id, [])
            system = systems.get(conv_id)
            context: list[tuple[str, str]] = [("system", system)] if system else []
            for msg in messages.get(conv_id, []):
                if msg.role == "assistant":
                    stored = redact(msg.content)[0]  # what log_request wrote for this reply
                    match = next((i for i, (_, text) in enumerate(pending) if text == stored), None)
                    if match is not None:
                        row_id = pending.pop(match)[0]
                        if row_id in wanted[conv_id]:
                            out[row_id] = tuple(context)
                if not msg.filtered:
                    context.append((msg.role, msg.content))
    return out


class RatingStore(Database):
    """Ratings on the request log's rows, through the functions above."""

    def record_feedback(
        self,
        key_id: str,
        response_id: str,
        rating: int,
        better_answer: str | None = None,
        comment: str | None = None,
        reason: str | None = None,
    ) -> Feedback:
        """Rate the key's answer ``response_id`` (+1/-1), with an optional better answer, comment and reason (a
        thumbs down's: ``FEEDBACK_REASONS``), on its request-log row; NotFoundError for another key's or an unknown
        id, DataError for a request without an answer or a reason on a thumbs up (``serving.state.ratings``)."""
        with self._write() as conn:
            return record(conn, key_id, response_id, rating, better_answer, comment, utc_now(), reason)

    def training_feedback(self, until: datetime | None = None) -> list[TrainingFeedback]:
        """Every rated answer (rated before ``until``), across keys, for training curation: only those of keys
        opted in now, outside deleted conversations, carry their text (``serving.state.ratings.training_rows``)."""
        with self._read() as conn:
            return training_rows(conn, until)

    # shadow log
