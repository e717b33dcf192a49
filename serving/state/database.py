"""The serving database's connection: one SQLAlchemy engine per gateway process, its tables created and brought up
to date on open (``serving.state.migrations``), and the read and write transactions every part of the store uses.

``Database`` is the base of the store's parts (``serving.state.keys``, ``conversations``, ``usage``, ``ratings``,
``shadow_log``); ``serving.state.store.ServingStore`` joins them. SQLite specifics (set on every connection): WAL
journal (readers never block the writer), a busy timeout, foreign keys on, and write transactions opened with
``BEGIN IMMEDIATE`` so that a read-then-write transaction queues on the busy timeout instead of failing with
"database is locked" when another writer got there first.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Self

import sqlalchemy as sa
from sqlalchemy.exc import ArgumentError, NoSuchModuleError, SQLAlchemyError

from core.errors import ConfigError
from serving.state.migrations import add_missing_columns, add_missing_indexes
from serving.state.schema import metadata

log = logging.getLogger("lifecycle.serving")
SQLITE_BUSY_TIMEOUT_MS = 10_000
_WRITE = "lc_write"  # execution option that makes the SQLite begin hook open a write transaction


class Database:
    """One SQLAlchemy engine on ``url`` (SQLite or Postgres), the schema created or upgraded on open."""

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
            added = add_missing_columns(self._writer)
            added += add_missing_indexes(self._writer)
        except SQLAlchemyError as exc:
            engine.dispose()
            raise ConfigError(f"cannot open the serving database {shown}: {exc}") from exc
        if added:
            log.info("serving database %s upgraded: added %s", shown, ", ".join(added))

    def close(self) -> None:
        self._engine.dispose()

    def __enter__(self) -> Self:
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


def utc_now() -> datetime:
    return datetime.now(UTC)
