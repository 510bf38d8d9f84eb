"""One market snapshot shared by every operator watching: at most one query per second.

Every open operator page polls every 1.5 s; without sharing, ten of them would run the
market's aggregates ten times as often, for the same answer.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from billing.activity import MarketActivity


class SharedSnapshot:
    """The latest `MarketActivity`, reused while younger than `max_age` seconds."""

    def __init__(self, max_age: float = 1.0) -> None:
        self._max_age = max_age
        self._taken = -float("inf")
        self._value: MarketActivity | None = None
        self._lock = asyncio.Lock()

    async def get(self, read: Callable[[], MarketActivity]) -> MarketActivity:
        """The shared snapshot; `read` (run in a thread) takes a new one when it is stale."""
        async with self._lock:  # concurrent pollers wait for one read instead of each running it
            if self._value is None or time.monotonic() - self._taken >= self._max_age:
                self._value = await asyncio.to_thread(read)
                self._taken = time.monotonic()
            return self._value
