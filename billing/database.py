"""Engines for the ledger: SQLite set up to serialize writers, PostgreSQL through psycopg 3.

SQLite: every write transaction starts with `BEGIN IMMEDIATE`, so concurrent writers queue on
the busy timeout instead of failing on a lock upgrade halfway through; WAL lets readers run
beside the writer. pysqlite's own transaction handling is switched off so that SQLAlchemy's
BEGIN is the one that counts.

SQLite's durability is the URL's `synchronous` parameter (`sqlite:///ledger.db?synchronous=full`).
The default, `normal`, is what SQLite recommends with WAL: a committed transaction survives the
server process crashing or being killed at any point, and the database is never corrupt, but
the last transactions before a power failure or operating-system crash may be rolled back.
`full` syncs the disk at every commit (about 1.7 ms each on the benchmark machine; the serving
path commits two or three times per request, fewer under load thanks to group commit).
Production deployments that need every commit on disk run PostgreSQL.

PostgreSQL: the service layer locks balance rows with `SELECT ... FOR UPDATE`; connections are
psycopg's, opened as `LedgerConnection` (`billing.postgres_connection`), which sends a
transaction's `BEGIN` together with the statements after it.

Both: the pool hands out the connection returned last (`pool_use_lifo`), not the one idle
longest. The server writes from one thread (`server.ledger_writer.writer`), so it then uses one
connection again and again while the others stay idle. On SQLite that is what keeps the
connection's page cache: a connection that finds the database changed by another connection
since its last transaction starts with an empty cache, and with the pool's default order
every transaction of the writer ran on the connection that had waited longest, so it read
back every page it touched (`tests/billing/test_connection_reuse.py`: 14 reads of the file per
write against 0.08). On PostgreSQL it changed nothing measurable at 20 connections; there it
leaves the connections the server does not need idle at the bottom of the pool, where an idle
timeout may close them (a transaction that meets a dead pooled connection runs again on a
fresh one: `Ledger._write`).
"""

from __future__ import annotations

import sqlite3
from typing import Any, cast

from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.engine import URL, make_url
from sqlalchemy.engine.default import DefaultDialect
from sqlalchemy.exc import ArgumentError, DBAPIError
from sqlalchemy.pool import ConnectionPoolEntry, QueuePool

from inference_auctions.billing.errors import InvalidInput, LedgerUnavailable
from inference_auctions.billing.postgres_connection import LedgerConnection, quiet_lost_pipelines

# Passed as an execution option by read-only operations: a deferred BEGIN takes no write lock.
READ_ONLY = "ledger_read_only"
SQLITE_BUSY_TIMEOUT_S = 30.0
SQLITE_SYNCHRONOUS = ("normal", "full")


def normalize_url(url: str | URL) -> URL:
    """Parse `url`; a bare `postgresql://` URL gets the psycopg 3 driver that is installed."""
    parsed = make_url(url)
    if parsed.drivername in {"postgresql", "postgres"}:
        parsed = parsed.set(drivername="postgresql+psycopg")
    return parsed


def mask_database_url(url: str) -> str:
    """`url` with its password hidden, fit for logs and banners; unparseable text as given."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except ArgumentError:
        return url  # not a database URL: opening it will say so


def unavailable(error: Exception) -> LedgerUnavailable:
    """The ledger's own error for a database that is down, locked or out of connections."""
    # The driver's first line names the cause ("connection refused", "database is locked").
    cause = error.orig if isinstance(error, DBAPIError) and error.orig is not None else error
    first_line = str(cause).strip().splitlines()
    return LedgerUnavailable(first_line[0] if first_line else type(cause).__name__)


def create_ledger_engine(
    url: str | URL,
    *,
    wal_autocheckpoint: int | None = None,
    sqlite_busy_timeout: float | None = None,
    **kwargs: Any,
) -> Engine:
    """An engine for `url` with the ledger's locking set up; kwargs go to `create_engine`.
    `wal_autocheckpoint` (SQLite only): the WAL's size in pages past which a connection that
    commits checkpoints (SQLite's default, 1,000, where None), for a server that checkpoints
    from a thread of its own (`billing.wal_checkpoints`). `sqlite_busy_timeout` (SQLite only):
    seconds a writer waits for the lock (`SQLITE_BUSY_TIMEOUT_S` where None)."""
    parsed = normalize_url(url)
    dialect = cast("type[DefaultDialect]", parsed.get_dialect())
    poolclass = kwargs.get("poolclass") or dialect.get_pool_class(parsed)
    if issubclass(poolclass, QueuePool):  # SQLite in memory has a connection per thread
        kwargs.setdefault("pool_use_lifo", True)  # see the module docstring
    else:  # a pool without a size: the size settings do not apply
        kwargs.pop("pool_size", None)
        kwargs.pop("max_overflow", None)
    if parsed.get_backend_name() != "sqlite":
        # No `pool_pre_ping`: the ledger runs a transaction again when its pooled connection
        # turns out dead before the commit (`Ledger._write`), instead of paying a round trip
        # on every checkout to find out first.
        engine = create_engine(parsed, **kwargs)
        if engine.dialect.driver == "psycopg":
            _open_ledger_connections(engine)
        return engine
    synchronous = parsed.query.get("synchronous", "normal")
    if synchronous not in SQLITE_SYNCHRONOUS:
        raise InvalidInput(
            "database_url",
            f"synchronous={synchronous!r} is not one of {', '.join(SQLITE_SYNCHRONOUS)}",
        )
    parsed = parsed.difference_update_query(["synchronous"])
    connect_args = dict(kwargs.pop("connect_args", {}))
    busy_timeout = SQLITE_BUSY_TIMEOUT_S if sqlite_busy_timeout is None else sqlite_busy_timeout
    connect_args.setdefault("timeout", busy_timeout)
    engine = create_engine(parsed, connect_args=connect_args, **kwargs)
    _set_up_sqlite(engine, str(synchronous), wal_autocheckpoint)
    return engine


def sqlite_busy_timeout_seconds() -> float:
    """How long a SQLite writer waits for the lock, as this process is set up now: what a
    process of the server's that opens the same database should wait too."""
    return SQLITE_BUSY_TIMEOUT_S


def in_a_file(engine: Engine) -> bool:
    """Whether `engine`'s SQLite database is a file (not in memory): one with a WAL."""
    return engine.dialect.name == "sqlite" and engine.url.database not in (None, "", ":memory:")


def _open_ledger_connections(engine: Engine) -> None:
    """Connect with `LedgerConnection` (see `billing.postgres_connection`), with the same
    arguments SQLAlchemy would pass to psycopg."""
    quiet_lost_pipelines()

    @event.listens_for(engine, "do_connect")
    def _connect(
        _dialect: Any, _record: ConnectionPoolEntry, cargs: list[Any], cparams: dict[str, Any]
    ) -> LedgerConnection:
        return LedgerConnection.connect(*cargs, **cparams)


def _set_up_sqlite(engine: Engine, synchronous: str, wal_autocheckpoint: int | None) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: sqlite3.Connection, _record: ConnectionPoolEntry) -> None:
        # None hands transaction control to the BEGIN emitted below.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        try:
            cursor.execute("PRAGMA foreign_keys = ON")
            if in_a_file(engine):
                cursor.execute("PRAGMA journal_mode = WAL")
            cursor.execute(f"PRAGMA synchronous = {synchronous.upper()}")
            if wal_autocheckpoint is not None:
                cursor.execute(f"PRAGMA wal_autocheckpoint = {int(wal_autocheckpoint)}")
        finally:
            cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(connection: Connection) -> None:
        read_only = connection.get_execution_options().get(READ_ONLY, False)
        connection.exec_driver_sql("BEGIN DEFERRED" if read_only else "BEGIN IMMEDIATE")
