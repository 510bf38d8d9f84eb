"""Fixtures of the scale-out tests: a PostgreSQL ledger several replicas share, and SMG.

Without the `smg` executable the SMG tests are skipped with the way to install it, unless
`INFERENCE_AUCTION_REQUIRE_SMG=1` (set by CI), which makes them fail instead.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from inference_auctions.server.cluster.smg import SMGMissing, find_smg
from tests.db_fixtures import MigratedDatabase, migrated_database


@pytest.fixture
def postgres_db(tmp_path: Path) -> Iterator[MigratedDatabase]:
    """A migrated PostgreSQL ledger in a schema of its own, for every replica of a test."""
    with migrated_database("postgres", tmp_path) as db:
        yield db


@pytest.fixture
def smg() -> str:
    """The `smg` executable; skips (fails under CI) when it is not installed."""
    try:
        return find_smg()
    except SMGMissing as missing:
        if os.environ.get("INFERENCE_AUCTION_REQUIRE_SMG") == "1":
            pytest.fail(f"{missing} (INFERENCE_AUCTION_REQUIRE_SMG=1)", pytrace=False)
        pytest.skip(str(missing))
