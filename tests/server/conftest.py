"""Fixtures of the server tests: a real server on each ledger backend."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.db_fixtures import MigratedDatabase, ledger, ledger_db
from tests.server.harness import RunningServer, running_server

__all__ = ["ledger", "ledger_db", "server"]


@pytest.fixture
def server(ledger_db: MigratedDatabase) -> Iterator[RunningServer]:
    """The auction server with the embedded engine, on SQLite and on PostgreSQL."""
    with running_server(ledger_db) as running:
        yield running
