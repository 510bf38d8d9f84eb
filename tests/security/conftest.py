"""Fixtures of the security tests: a real server on each ledger backend, and a way to see
that a request changed nothing in the ledger."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import Engine, select

from inference_auctions.billing.models import Base
from tests.db_fixtures import MigratedDatabase, ledger, ledger_db
from tests.server.harness import RunningServer, running_server

__all__ = ["ledger", "ledger_db", "ledger_snapshot", "server"]


@pytest.fixture
def server(ledger_db: MigratedDatabase) -> Iterator[RunningServer]:
    """The auction server with the embedded engine, on SQLite and on PostgreSQL."""
    with running_server(ledger_db) as running:
        yield running


def ledger_snapshot(engine: Engine) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of every ledger table, in primary-key order: equal snapshots mean that
    nothing (users, budgets, balances, entries, holds, batches, requests) changed. The
    replicas' pricing announcements are left out: a running server renews its own."""
    snapshot = {}
    with engine.connect() as connection:
        for table in Base.metadata.sorted_tables:
            if table.name == "replica_rules":
                continue  # which replicas run, and when they last said so: no money
            query = select(table).order_by(*table.primary_key.columns)
            snapshot[table.name] = [tuple(row) for row in connection.execute(query)]
    return snapshot
