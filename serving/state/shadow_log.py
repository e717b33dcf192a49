"""The shadow log in the serving database: one row per mirrored request, comparing the shadow's answer with the
user's (``serving.pipeline.shadow``); it holds no text."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime

import sqlalchemy as sa

from serving.state.database import Database
from serving.state.schema import ShadowLogEntry, shadow_t, to_utc

_SHADOW_FIELDS = [c.name for c in shadow_t.columns if c.name != "id"]


class ShadowLogStore(Database):
    """The ``shadow_log`` table."""

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
