"""Schema migrations of the serving database: tables created by an older version get the columns and indexes
added since, on open (``Database.__init__``). Additive and idempotent, on SQLite and Postgres alike."""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.exc import SQLAlchemyError

from serving.state.schema import metadata


def add_missing_columns(engine: sa.Engine) -> list[str]:
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


def add_missing_indexes(engine: sa.Engine) -> list[str]:
    """Create the indexes of ``metadata`` that tables created by an older version lack (``create_all`` skips
    existing tables); ``CREATE INDEX`` after checking, and a lost race re-checked, like ``add_missing_columns``."""
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
