"""The gateway's persistent state: API keys, conversations, daily usage, the request log and the shadow log, on
SQLAlchemy Core.

One ``ServingStore(url)`` per gateway process, built in the app factory and closed on shutdown. The API is
synchronous (the gateway calls it from a thread pool). The same code runs on SQLite (the default,
``$LIFECYCLE_HOME/serving/serving.db``) and on ``postgresql+psycopg://`` URLs: no dialect-specific SQL, and the
portable tables of ``serving.state.schema``, whose records (``ApiKey``, ``Conversation``, ``RequestLogEntry`` ...) are
re-exported here. A database created by an older version gets the columns added since then on open
(``serving.state.migrations``: additive and idempotent, on both backends).

Tenancy: every conversation read or write takes the caller's key id; a conversation of another key, or one that
was deleted, raises ``NotFoundError`` exactly like one that never existed, so ids leak nothing. The one exception is
the operator's read for training curation (``training_conversations``): across keys, but only the text of
conversations whose key opted in (``training_opt_in``, ``lifecycle keys create NAME --training-opt-in``) and that
were not deleted.

Feedback (``record_feedback``, ``training_feedback``): a rating of an answer is stored on its request-log row, by
the key that asked only (``serving.state.ratings``); curation reads it across keys with the same consent rule.

Privacy: ``log_request`` redacts prompts and replies (``core.redact``) before writing, so the request log
that monitoring and training read never holds an email, phone or card number. Conversation history is kept as
written, because continuing a conversation needs it; deleting one hides it at once, erases its texts from the
request log, its feedback and the shadow log at once (numbers stay, for billing), and ``purge_deleted`` erases the
conversation after the retention period. The log texts of every request are erased after
``serving.log_text_retention_days`` by the scheduled log-retention flow (``serving.state.retention``).

The parts, one module each, joined here by ``ServingStore``: the connection and its transactions
(``serving.state.database``, migrations in ``serving.state.migrations``), keys (``serving.state.keys``),
conversations (``serving.state.conversations``), usage and the request log (``serving.state.usage``), ratings
(``serving.state.ratings``), the shadow log (``serving.state.shadow_log``) and the retention of log texts
(``serving.state.retention``).
"""

from __future__ import annotations

from serving.state.conversations import ROLES, ConversationStore, new_conversation_id
from serving.state.database import SQLITE_BUSY_TIMEOUT_MS
from serving.state.keys import KeyStore
from serving.state.ratings import RatingStore
from serving.state.retention import LogRetention
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
    usage_t,
)
from serving.state.shadow_log import ShadowLogStore
from serving.state.usage import UsageLog

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


class ServingStore(KeyStore, ConversationStore, UsageLog, RatingStore, ShadowLogStore, LogRetention):
    """Keys, conversations, usage, the request log, ratings and the shadow log on one SQLAlchemy engine (see the
    module docstring)."""
