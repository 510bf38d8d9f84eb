"""The waiting pool: when a batch closes, and backpressure from the engine.

Batching is work-conserving: waiting only pays when it lets the auction order requests that
compete for the engine, so the pool never holds a request back from an engine that could
start it. A batch closes with whatever waits (up to `batch_size`) as soon as

- the engine is not saturated (a `saturated` callback, measured by the caller: requests sent
  to the engine that have not started yet), and fewer than `max_inflight` requests are
  outstanding there (a hard cap), and
- the optional collection window has passed: `max_wait` since the oldest waiting request
  arrived, or `batch_size` requests wait, or the pool drains. With `max_wait` 0 (the default)
  a lone request goes straight through.

While the engine is saturated, requests accumulate here, and the next batch, once the engine
can take more, is an auction over the whole backlog: a later high bidder overtakes the low
bidders that still wait here, which it never could once they queue inside the engine.

The pool knows nothing about auctions or engines: it hands each closed batch, in arrival order,
to a `clear` callback, and asks callbacks how busy the engine is. Whoever changes the answer of
those callbacks (a request starts or leaves the engine) calls `wake`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

Item = TypeVar("Item")


class QueueFull(Exception):
    """The pool already holds `max_queue` requests."""


class PoolClosed(Exception):
    """The pool is draining for shutdown and takes no new requests."""


@dataclass(frozen=True, slots=True)
class BatchingPolicy:
    """When a batch may close."""

    batch_size: int
    max_wait: float  # seconds of optional collection window; 0: close at once
    max_inflight: int
    max_queue: int


@dataclass(eq=False)
class _Waiting(Generic[Item]):
    item: Item
    arrived: float = field(default_factory=time.monotonic)


def _never() -> bool:
    return False


class BatchPool(Generic[Item]):
    """Collects requests and closes batches whenever the engine can take more (see above)."""

    def __init__(
        self,
        policy: BatchingPolicy,
        clear: Callable[[list[Item]], Awaitable[None]],
        inflight: Callable[[], int],
        saturated: Callable[[], bool] = _never,
        select: Callable[[list[Item], int], list[int]] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`select(waiting, room)`: the places of the waiting requests a batch takes now, at
        most `room` (`server.engine_shares`); by default the oldest. `clock`: seconds, for the
        collection window."""
        self._policy = policy
        self._clock = clock
        self._select = select
        # Set when the waiting requests may not go now (`select` took none): the pool waits
        # for a wake-up (a request left the engine, or a new one came).
        self._blocked = False
        self._clear = clear
        self._inflight = inflight
        self._saturated = saturated
        self._waiting: list[_Waiting[Item]] = []
        self._wake = asyncio.Event()
        self._draining = False
        self._idle = asyncio.Event()
        self._idle.set()

    def __len__(self) -> int:
        return len(self._waiting)

    def submit(self, item: Item) -> None:
        """Add a request; raises `QueueFull` or `PoolClosed` instead of queueing it."""
        if self._draining:
            raise PoolClosed("the server is shutting down and accepts no new requests")
        if len(self._waiting) >= self._policy.max_queue:
            raise QueueFull(f"{len(self._waiting)} requests are already waiting")
        self._waiting.append(_Waiting(item, self._clock()))
        self._idle.clear()
        self._blocked = False
        self._wake.set()

    def withdraw(self, item: Item) -> bool:
        """Take back a request that no batch has taken yet; False if it is already cleared."""
        for index, waiting in enumerate(self._waiting):
            if waiting.item is item:
                del self._waiting[index]
                self._mark_idle()
                return True
        return False

    def wake(self) -> None:
        """The engine's load changed (a request started or left): a batch may now close."""
        self._blocked = False
        self._wake.set()

    async def drain(self) -> None:
        """Stop taking requests and wait until every waiting one has been cleared."""
        self._draining = True
        self._wake.set()
        await self._idle.wait()

    async def run(self) -> None:
        """Close batches until cancelled."""
        while True:
            timeout = self._seconds_until_due()
            self._wake.clear()
            if timeout is None or timeout > 0:
                # Not `asyncio.wait_for`: on Python 3.11 a cancel that lands in the turn the
                # wait ends (the drain's wake-up, then `stop`) is dropped, and the pool never
                # stops; `asyncio.timeout` keeps it.
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(timeout):
                        await self._wake.wait()
            while self._ready():
                # `max_inflight` is a hard cap: a batch takes only the room left under it.
                room = min(self._policy.batch_size, self._policy.max_inflight - self._inflight())
                batch = self._take(room)
                if not batch:
                    self._blocked = True
                    break
                await self._clear([waiting.item for waiting in batch])
                self._mark_idle()

    def _take(self, room: int) -> list[_Waiting[Item]]:
        """Remove and return the requests the next batch takes."""
        if self._select is None:
            batch = self._waiting[:room]
            del self._waiting[:room]
            return batch
        places = self._select([waiting.item for waiting in self._waiting], room)
        batch = [self._waiting[place] for place in places]
        chosen = set(places)
        self._waiting = [w for place, w in enumerate(self._waiting) if place not in chosen]
        return batch

    def _engine_busy(self) -> bool:
        """Whether the engine should not be given more now, however long requests wait."""
        return self._inflight() >= self._policy.max_inflight or self._saturated()

    def _ready(self) -> bool:
        if not self._waiting or self._blocked or self._engine_busy():
            return False
        if self._draining or len(self._waiting) >= self._policy.batch_size:
            return True
        return self._clock() - self._waiting[0].arrived >= self._policy.max_wait

    def _seconds_until_due(self) -> float | None:
        """How long until the oldest request's window runs out; None: wait for a wake-up."""
        if not self._waiting or self._blocked or self._engine_busy():
            return None
        return self._waiting[0].arrived + self._policy.max_wait - self._clock()

    def _mark_idle(self) -> None:
        if not self._waiting:
            self._idle.set()
