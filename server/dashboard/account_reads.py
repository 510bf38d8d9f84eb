"""The account view's reads (`GET /v1/dashboard/account`), bounded in what they cost.

An account's figures are read from the ledger in one pass over the user's requests and entries
of its period: tens of milliseconds for a busy account, more for a very busy one. So that a
flood of them (from one key or from many) does not become the other users' latency:
- an answer (its rendered body) is kept `KEPT_SECONDS` for every caller of the same user (its
  pages, its tabs, its flood), and callers that arrive while it is being read wait for it;
- a read that is not kept costs its user's own budget of server time (`server.api.cost_budget`):
  429 once it is spent;
- at most `CONCURRENT_READS` of them run at once in the process, whoever asks.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Callable

from inference_auctions.server.api.cost_budget import CostBudget

__all__ = ["AccountReads"]

# The page polls every 1.5 s: one read per poll of one page; more pages share it.
KEPT_SECONDS = 1.0
CONCURRENT_READS = 2
# Each user's bucket of reading time: 2 s, refilled at a quarter of a second per second.
# A page of an account whose read takes 100 ms spends 0.07 s a second.
COST_BURST = 2.0
COST_RATE = 0.25
_KEPT_USERS = 1_024


class AccountReads:
    """The kept answers, the budgets and the bound of the module docstring."""

    def __init__(self) -> None:
        self._kept: OrderedDict[str, tuple[float, bytes]] = OrderedDict()
        self._locks: dict[str, asyncio.Lock] = {}
        self._running: asyncio.Semaphore | None = None  # made on the serving loop
        self._budget = CostBudget(
            "the account view",
            COST_BURST,
            COST_RATE,
            f"answers are kept {KEPT_SECONDS:g} s: ask less often",
        )

    async def get(self, user: str, read: Callable[[], bytes]) -> bytes:
        """`user`'s account as its answer's body, by `read` (run in a worker thread: the
        ledger's reads and the rendering) unless a fresh one is kept."""
        lock = self._locks.setdefault(user, asyncio.Lock())
        try:
            async with lock:
                kept = self._kept.get(user)
                now = time.monotonic()
                if kept is not None and kept[0] > now:
                    return kept[1]
                self._budget.check(user, now)  # 429 once its budget is spent
                if self._running is None:
                    self._running = asyncio.Semaphore(CONCURRENT_READS)
                async with self._running:
                    started = time.monotonic()
                    value = await asyncio.to_thread(read)
                    finished = time.monotonic()
                self._budget.spend(user, finished, finished - started)
                self._keep(user, finished + KEPT_SECONDS, value)
                return value
        finally:
            if not lock.locked() and self._locks.get(user) is lock:
                del self._locks[user]  # nobody waits on it: the next caller makes a new one

    def _keep(self, user: str, until: float, value: bytes) -> None:
        self._kept[user] = (until, value)
        self._kept.move_to_end(user)
        while len(self._kept) > _KEPT_USERS:
            self._kept.popitem(last=False)
