"""A stored chat turn as the serving database keeps it and training curation reads it: the one shape both sides
share (``serving`` and ``training`` do not import each other)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime


@dataclass(frozen=True)
class StoredTurn:
    """One stored message. ``status``, on assistant turns only: the status of the request-log row that recorded
    the reply (``ok``, or ``content_filter`` for a refusal or stopped reply the gateway wrote), None when no log
    row matches it (a lost log write)."""

    role: str
    content: str
    created_at: datetime
    model_version: str | None = None
    status: str | None = None
