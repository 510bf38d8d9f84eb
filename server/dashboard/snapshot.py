"""Snapshots shared by every operator watching: the market's aggregates run at most once per
`max_age`, however many dashboards poll.

Every open operator page polls every 1.5 s; without sharing, ten of them would run the same
aggregates ten times as often, for the same answer.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from inference_auctions.billing import MarketActivity, PrefixSquatter, Spender
from inference_auctions.server.dashboard.account_reads import AccountReads
from inference_auctions.server.dashboard.health import ReconcileWatch
from inference_auctions.server.dashboard.sessions import SessionStore

T = TypeVar("T")


class SharedSnapshot(Generic[T]):
    """The latest value of a read, reused while younger than `max_age` seconds."""

    def __init__(self, max_age: float) -> None:
        self._max_age = max_age
        self._taken = -float("inf")
        self._value: T | None = None
        self._lock = asyncio.Lock()

    async def get(self, read: Callable[[], T]) -> T:
        """The shared value; `read` (run in a thread) takes a new one when it is stale."""
        async with self._lock:  # concurrent pollers wait for one read instead of each running it
            if self._value is None or time.monotonic() - self._taken >= self._max_age:
                self._value = await asyncio.to_thread(read)
                self._taken = time.monotonic()
            return self._value


@dataclass
class DashboardState:
    """What the dashboard keeps in the server process."""

    sessions: SessionStore = field(default_factory=SessionStore)
    accounts: AccountReads = field(default_factory=AccountReads)
    reconcile: ReconcileWatch = field(default_factory=ReconcileWatch)
    market: SharedSnapshot[MarketActivity] = field(default_factory=lambda: SharedSnapshot(1.0))
    # The period's top spenders sum every charge of the period: fresh enough every 5 s.
    spenders: SharedSnapshot[list[Spender]] = field(default_factory=lambda: SharedSnapshot(5.0))
    # Low-bid requests under other users' prefixes over the window: as fresh as the spenders.
    squatters: SharedSnapshot[list[PrefixSquatter]] = field(
        default_factory=lambda: SharedSnapshot(5.0)
    )
