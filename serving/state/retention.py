"""Erasing the texts of the logs, keeping their numbers: what deleting a conversation and the retention period
(``serving.log_text_retention_days``) do to the request log, its feedback and the shadow log.

A text is a prompt, a reply, an error message (it may quote either), a better answer or a comment of a rating;
they become NULL. Everything else stays: tokens, cost, latencies, statuses, ratings, verdicts, so usage, billing,
the canary analysis and the drift history still add up (the drift check reads prompts of its recent window only,
well inside any retention period).

    store.delete_conversation(key_id, conv_id)          # its texts in the logs are erased in the same transaction
    store.erase_old_log_texts(timedelta(days=30))       # the scheduled log-retention flow (flows/retention.py)
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa

from serving.state.database import Database, utc_now
from serving.state.schema import log_t, shadow_t, to_utc

# (with them the reply's digest: a reply whose text is gone is not vouched for any more, serving.safety.replies)
LOG_TEXTS = ("prompt_text", "response_text", "error", "feedback_better", "feedback_comment", "reply_digest")
SHADOW_TEXTS = ("error",)


def _has_text(table: sa.Table, names: tuple[str, ...]) -> sa.ColumnElement[bool]:
    return sa.or_(*[table.c[n].is_not(None) for n in names])


def erase_log_texts(conn: sa.Connection, where: sa.ColumnElement[bool]) -> int:
    """Erase the texts of the request-log rows ``where`` selects, and of the shadow comparisons of the same
    requests; returns how many request-log rows had a text."""
    requests = sa.select(log_t.c.request_id).where(where)
    conn.execute(
        sa.update(shadow_t)
        .where(shadow_t.c.request_id.in_(requests), _has_text(shadow_t, SHADOW_TEXTS))
        .values(dict.fromkeys(SHADOW_TEXTS))
    )
    erased: Any = conn.execute(
        sa.update(log_t).where(where, _has_text(log_t, LOG_TEXTS)).values(dict.fromkeys(LOG_TEXTS))
    )
    return int(erased.rowcount)


class LogRetention(Database):
    """The retention period of the log texts (the conversations' own is ``purge_deleted``'s)."""

    def erase_old_log_texts(self, older_than: timedelta, now: datetime | None = None) -> tuple[int, int]:
        """Erase the texts of request-log and shadow-log rows written more than ``older_than`` ago; returns how
        many rows of each had a text (0, 0 on a second run: idempotent)."""
        cutoff = to_utc(now or utc_now()) - older_than
        with self._write() as conn:
            shadow: Any = conn.execute(
                sa.update(shadow_t)
                .where(shadow_t.c.at < cutoff, _has_text(shadow_t, SHADOW_TEXTS))
                .values(dict.fromkeys(SHADOW_TEXTS))
            )
            logged = erase_log_texts(conn, log_t.c.at < cutoff)
        return logged, int(shadow.rowcount)
