"""Daily usage per key and model, and the request log (prompts and replies redacted, ``core.redact``, before
they are written: the log that monitoring and training read never holds an email, phone or card number).
``log_answer`` writes both in one transaction, so usage always adds up to the request log."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from datetime import date, datetime

import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError

from core.errors import DataError
from core.redact import redact
from serving.state.database import Database, utc_now
from serving.state.schema import RequestLogEntry, UsageRow, log_t, to_utc, usage_t

_LOG_FIELDS = [c.name for c in log_t.columns if c.name != "id"]


class UsageLog(Database):
    """The ``usage_daily`` and ``request_log`` tables."""

    def record_usage(
        self,
        key_id: str,
        model: str,
        prompt_tokens: int,
        completion_tokens: int,
        at: datetime | None = None,
        cost_usd: float = 0.0,
    ) -> None:
        """Add one request to the key's (model, UTC day) totals.

        Portable upsert: ``UPDATE ... SET n = n + :x`` (atomic per row on every backend); if no row matched,
        INSERT. Two first requests of a day racing to insert collide on the primary key; the loser retries and
        takes the UPDATE path. On SQLite the write transaction is IMMEDIATE, so the race cannot even happen.
        """
        self._usage_and_log(key_id, model, prompt_tokens, completion_tokens, cost_usd, at, None)

    def log_answer(self, entry: RequestLogEntry) -> RequestLogEntry:
        """``record_usage`` (on the entry's key, version and tokens) and ``log_request`` in one transaction: a
        process killed mid-way leaves both or neither, so usage always adds up to the request log."""
        if entry.key_id is None or entry.model_version is None:
            raise DataError(f"an answer's usage needs its key and version ({entry.request_id})")
        stored = self._usage_and_log(
            entry.key_id,
            entry.model_version,
            entry.prompt_tokens,
            entry.completion_tokens,
            entry.cost_usd or 0.0,
            entry.at,
            entry,
        )
        assert stored is not None
        return stored

    def _usage_and_log(
        self,
        key_id: str,
        model: str,
        prompt_tokens: int,
        completion_tokens: int,
        cost_usd: float,
        at: datetime | None,
        entry: RequestLogEntry | None,
    ) -> RequestLogEntry | None:
        if prompt_tokens < 0 or completion_tokens < 0 or cost_usd < 0:
            raise DataError(f"token counts and cost must be >= 0 ({prompt_tokens}, {completion_tokens}, {cost_usd})")
        day = to_utc(at or utc_now()).date()
        c = usage_t.c
        row = sa.and_(c.key_id == key_id, c.model == model, c.day == day)
        bump = {
            "requests": c.requests + 1,
            "prompt_tokens": c.prompt_tokens + prompt_tokens,
            "completion_tokens": c.completion_tokens + completion_tokens,
            "cost_usd": c.cost_usd + cost_usd,
        }
        stored = _redacted(entry) if entry is not None else None
        for attempt in range(3):
            try:
                with self._write() as conn:
                    if conn.execute(sa.update(usage_t).where(row).values(bump)).rowcount == 0:
                        first = {
                            "requests": 1,
                            "prompt_tokens": prompt_tokens,
                            "completion_tokens": completion_tokens,
                            "cost_usd": cost_usd,
                        }
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
        query = sa.select(c.day, c.model, c.requests, c.prompt_tokens, c.completion_tokens, c.cost_usd)
        query = query.where(c.key_id == key_id)
        if start is not None:
            query = query.where(c.day >= start)
        if end is not None:
            query = query.where(c.day <= end)
        with self._read() as conn:
            return [UsageRow(*r) for r in conn.execute(query.order_by(c.day, c.model))]

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

    def known_replies(self, digests: Sequence[str]) -> set[str]:
        """Which of ``digests`` (``serving.safety.replies.reply_digest``) a logged reply has: any replica's, any
        time within the log texts' retention."""
        if not digests:
            return set()
        c = log_t.c
        with self._read() as conn:
            rows = conn.execute(sa.select(c.reply_digest).where(c.reply_digest.in_(list(digests))).distinct()).all()
        return {r[0] for r in rows}

    # feedback


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
