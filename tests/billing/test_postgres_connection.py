"""The ledger's PostgreSQL connection sends a transaction's `BEGIN` with the statements after it
(`billing.postgres_connection`), and a transaction is still exactly one transaction."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
import pytest
from sqlalchemy import Connection, Engine, text

from bench.round_trips import RoundTrips
from inference_auctions.billing.database import create_ledger_engine
from inference_auctions.billing.postgres_connection import LedgerConnection
from tests.db_fixtures import require_postgres


@pytest.fixture
def relayed() -> Iterator[tuple[Engine, RoundTrips]]:
    relay = RoundTrips(require_postgres())
    engine = create_ledger_engine(relay.url, pool_size=1, max_overflow=0)
    try:
        with engine.begin() as connection:
            connection.execute(text("CREATE TEMPORARY TABLE IF NOT EXISTS probe (n int)"))
        yield engine, relay
    finally:
        engine.dispose()
        relay.close()


@contextmanager
def _raw(engine: Engine) -> Iterator[tuple[Connection, LedgerConnection]]:
    """A pooled connection of `engine`, and the psycopg connection under it."""
    with engine.connect() as connection:
        raw = connection.connection.dbapi_connection
        assert isinstance(raw, LedgerConnection)
        yield connection, raw


def _pipelined(connection: psycopg.Connection[object], *numbers: int) -> None:
    with connection.pipeline():
        cursor = connection.cursor()
        for number in numbers:
            cursor.execute("INSERT INTO probe VALUES (%s)", [number])


def test_the_ledger_engine_opens_ledger_connections(
    relayed: tuple[Engine, RoundTrips],
) -> None:
    with relayed[0].connect() as connection:
        assert isinstance(connection.connection.dbapi_connection, LedgerConnection)


def test_begin_travels_with_the_first_pipeline_and_is_sent_once(
    relayed: tuple[Engine, RoundTrips],
) -> None:
    engine, relay = relayed
    notices: list[str] = []
    with _raw(engine) as (connection, raw):
        raw.add_notice_handler(lambda notice: notices.append(str(notice.message_primary)))
        with relay.counting() as trips:
            _pipelined(raw, 1, 2, 3)
        # psycopg's own connection waits for the BEGIN first: two round trips.
        assert trips == [1]
        assert raw.info.transaction_status is psycopg.pq.TransactionStatus.INTRANS
        _pipelined(raw, 4)  # already in the transaction: no BEGIN at all
        raw.rollback()
        # One BEGIN: a second would have drawn "there is already a transaction in progress".
        assert notices == []
        assert connection.execute(text("SELECT count(*) FROM probe")).scalar() == 0


def test_a_transaction_begun_in_a_pipeline_commits_and_rolls_back_as_one(
    relayed: tuple[Engine, RoundTrips],
) -> None:
    with _raw(relayed[0]) as (connection, raw):
        _pipelined(raw, 1, 2)
        raw.commit()
        _pipelined(raw, 3)
        raw.rollback()  # the statement ran inside a transaction, not on its own
        counted = connection.execute(text("SELECT count(*), sum(n) FROM probe")).one()
        assert tuple(counted) == (2, 3)
        connection.rollback()


def test_outside_a_pipeline_and_in_autocommit_nothing_changes(
    relayed: tuple[Engine, RoundTrips],
) -> None:
    with _raw(relayed[0]) as (_, raw):
        raw.execute("INSERT INTO probe VALUES (7)")
        assert raw.info.transaction_status is psycopg.pq.TransactionStatus.INTRANS
        raw.rollback()
        raw.autocommit = True
        _pipelined(raw, 8)
        assert raw.info.transaction_status is psycopg.pq.TransactionStatus.IDLE  # committed
        raw.autocommit = False
        assert raw.execute("SELECT count(*), sum(n) FROM probe").fetchone() == (1, 8)
        raw.rollback()
