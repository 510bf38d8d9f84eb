"""The ledger's pool hands back the connection returned last, so that one writer keeps one
connection: its prepared statements on PostgreSQL, its page cache on SQLite."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, event

from inference_auctions.billing import HoldInput, Ledger, upgrade_schema
from inference_auctions.billing.database import create_ledger_engine
from tests.billing.helpers import read_calls
from tests.db_fixtures import MigratedDatabase

_POOLED = 3  # connections the pool holds once a burst of readers has come and gone
_WRITES = 40


def _fill_pool(engine: Engine) -> None:
    """Open `_POOLED` connections at once and return them all, as concurrent readers would."""
    connections = [engine.connect() for _ in range(_POOLED)]
    for connection in connections:
        connection.close()


def _holds(ledger: Ledger, count: int, prefix: str) -> None:
    for index in range(count):
        [placed] = ledger.place_holds([HoldInput("ada", f"{prefix}-{index}", 1_000)])
        assert not isinstance(placed, Exception), placed


def test_one_writer_uses_one_connection_of_the_pool(ledger_db: MigratedDatabase) -> None:
    engine = ledger_db.new_engine()
    ledger = Ledger(engine)
    ledger.create_user("ada", budget_micros=10**9)
    _fill_pool(engine)
    used: list[int] = []

    @event.listens_for(engine, "checkout")
    def _checked_out(dbapi_connection: Any, *_: Any) -> None:
        used.append(id(dbapi_connection))

    _holds(ledger, _WRITES, "lifo")
    assert len(used) >= _WRITES
    # The pool's default order would rotate through all of them.
    assert len(set(used)) == 1


def _reads_per_write(url: str, **engine_options: Any) -> float:
    upgrade_schema(url)
    engine = create_ledger_engine(url, **engine_options)
    try:
        ledger = Ledger(engine)
        ledger.create_user("ada", budget_micros=10**9)
        _fill_pool(engine)
        _holds(ledger, 5, "warm")
        before = read_calls()
        _holds(ledger, _WRITES, "timed")
        return (read_calls() - before) / _WRITES
    finally:
        engine.dispose()


@pytest.mark.skipif(not Path("/proc/self/io").exists(), reason="counts reads in /proc/self/io")
def test_sqlite_keeps_its_page_cache_between_writes(tmp_path: Path) -> None:
    reused = _reads_per_write(f"sqlite:///{tmp_path / 'lifo.db'}")
    rotated = _reads_per_write(f"sqlite:///{tmp_path / 'fifo.db'}", pool_use_lifo=False)
    # A connection that finds the database changed by another one re-reads every page it
    # touches; the same connection again reads (almost) nothing from the file.
    assert rotated >= 3
    assert reused < rotated / 3, (reused, rotated)
