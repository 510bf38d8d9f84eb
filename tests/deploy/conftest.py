"""Fixtures of the deployment tests: a real server whose exported series they read."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.db_fixtures import migrated_database
from tests.server.harness import RunningServer, running_server


@pytest.fixture
def server(tmp_path: Path) -> Iterator[RunningServer]:
    """The auction server with the embedded engine on a SQLite file: the series it exports do
    not depend on the ledger's database."""
    with migrated_database("sqlite", tmp_path) as db, running_server(db) as running:
        yield running
