"""Alembic environment: the URL comes from the caller or `LedgerSettings`, the schema from
billing's `metadata` (read from `billing.schema`, what billing gives Alembic alone; the rest
through billing's door, like the server).

`billing.migrate` passes either a live connection (`config.attributes["connection"]`) or a URL
(`config.attributes["url"]`); run by the plain `alembic` command, neither is set and the
settings (`INFERENCE_AUCTION_DATABASE_URL`) decide.
"""

from __future__ import annotations

from typing import Any

from alembic import context
from sqlalchemy import Connection

from inference_auctions.billing import LedgerSettings
from inference_auctions.billing.schema import create_ledger_engine, metadata

target_metadata = metadata


def _configure(connection: Connection) -> None:
    # Batch mode rebuilds a SQLite table by copy, drop and rename, and dropping a table that
    # other rows point at fails while foreign keys are enforced; so they are off while the
    # migrations run and checked after. The pragma is a no-op inside a transaction, so it goes
    # to the driver's connection directly (the ledger's engine BEGINs on every statement).
    relax_keys = connection.dialect.name == "sqlite" and not connection.in_transaction()
    if relax_keys:
        _sqlite_pragma(connection, "PRAGMA foreign_keys = OFF")
    try:
        _run(connection)
    finally:
        if relax_keys:
            broken = _sqlite_pragma(connection, "PRAGMA foreign_key_check")
            _sqlite_pragma(connection, "PRAGMA foreign_keys = ON")
    if relax_keys and broken:
        raise RuntimeError(f"the migrations left rows whose foreign keys point nowhere: {broken}")


def _sqlite_pragma(connection: Connection, pragma: str) -> list[Any]:
    cursor = connection.connection.driver_connection.cursor()  # type: ignore[union-attr]
    try:
        cursor.execute(pragma)
        return list(cursor.fetchall())
    finally:
        cursor.close()


def _run(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        # SQLite cannot ALTER most things in place; batch mode copies the table instead.
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    """Run the migrations on the caller's connection or on a new engine."""
    connection = context.config.attributes.get("connection")
    if connection is not None:
        _configure(connection)
        return
    url = context.config.attributes.get("url") or LedgerSettings().database_url
    engine = create_ledger_engine(url)
    try:
        with engine.connect() as connection:
            _configure(connection)
    finally:
        engine.dispose()


if context.is_offline_mode():
    raise SystemExit("offline (--sql) migrations are not supported; run against a database")
run_migrations_online()
