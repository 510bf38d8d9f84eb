"""Fixtures of the ledger tests: the shared database fixtures plus a controllable clock."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from inference_auctions.billing import Ledger
from tests.db_fixtures import MigratedDatabase, ledger, ledger_db

__all__ = ["ledger", "ledger_db"]


class Clock:
    """A clock that moves only when told to."""

    def __init__(self, now: datetime) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now

    def advance(self, **delta: float) -> datetime:
        """Move forward by `timedelta(**delta)` and return the new time."""
        self.now += timedelta(**delta)
        return self.now


@pytest.fixture
def clock() -> Clock:
    """A clock standing at Wednesday 2025-01-15 12:00 UTC."""
    return Clock(datetime(2025, 1, 15, 12, 0, tzinfo=UTC))


@pytest.fixture
def timed_ledger(ledger_db: MigratedDatabase, clock: Clock) -> Ledger:
    """A `Ledger` whose time is `clock`."""
    return Ledger(ledger_db.engine, clock=clock)
