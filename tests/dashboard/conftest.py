"""Fixtures of the dashboard tests: a real server on each ledger backend, and a headless
Chromium for the browser tests (Debian's `chromium` and `chromium-driver`, driven by
Selenium). Without the browser those tests skip, or fail when
INFERENCE_AUCTION_REQUIRE_BROWSER=1 (set by CI)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.dashboard.chromium import chromium, require_browser
from tests.db_fixtures import MigratedDatabase, ledger, ledger_db
from tests.server.harness import RunningServer, running_server

__all__ = ["ledger", "ledger_db", "server"]


@pytest.fixture
def server(ledger_db: MigratedDatabase) -> Iterator[RunningServer]:
    """The auction server with the embedded engine, on SQLite and on PostgreSQL."""
    with running_server(ledger_db) as running:
        yield running


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """A headless Chromium for the module's tests."""
    require_browser()
    with chromium() as driver:
        yield driver
