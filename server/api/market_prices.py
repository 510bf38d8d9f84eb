"""The market's recent prices (`GET /v1/market/prices`), answered from an aggregate in memory.

The server keeps the clearing samples (one per user and batch: its priority, its charge) of
the last seven days, at most `_MAX_SAMPLES` of them, the newest kept. It reads only what
cleared since its last read (`Ledger.clearing_after`, on the batches' closing-time index), at
most once per `_REFRESH_SECONDS`, so every replica sees every replica's batches; batches
committed late by another replica are caught by reading `_OVERLAP` back and skipping those
already seen. An answer is computed from memory and kept `_ANSWER_SECONDS` for the same
question; the questions that are computed cost their user's own budget of computing time
(429 past it), so a flood of them costs the other users nothing. No figure is published that
fewer than `MIN_USERS` users make up (`prices_json`), so no answer reveals one user's batch.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from inference_auctions.billing import ClearingSample, Ledger
from inference_auctions.server.api.cost_budget import CostBudget

__all__ = ["MarketPrices"]

HORIZON = timedelta(days=7)
_MAX_SAMPLES = 200_000
_PAGE_BATCHES = 5_000  # batches per read
_REFRESH_SECONDS = 2.0
_OVERLAP = timedelta(seconds=30)
_ANSWER_SECONDS = 5.0
_ANSWERS_KEPT = 256
# Each user's budget of computing time for answers not kept: a bucket of this many seconds,
# refilled at this many seconds per second.
_COST_BURST = 1.0
_COST_RATE = 0.2

Table = Callable[[list[ClearingSample], datetime, datetime], dict[str, Any]]


class MarketPrices:
    """The aggregate of the module docstring; `table` renders samples as the answer."""

    def __init__(self, ledger: Ledger, table: Table) -> None:
        self._ledger = ledger
        self._table = table
        self._samples: deque[ClearingSample] = deque(maxlen=_MAX_SAMPLES)
        self._cursor: datetime | None = None  # the latest closing time read
        self._seen: dict[str, datetime] = {}  # batch ids read within `_OVERLAP` of the cursor
        self._refreshed = -float("inf")
        self._refreshing = asyncio.Lock()
        self._answers: OrderedDict[tuple[int, int], tuple[float, dict[str, Any]]] = OrderedDict()
        self._budget = CostBudget(
            "market prices",
            _COST_BURST,
            _COST_RATE,
            f"answers are kept {_ANSWER_SECONDS:g} s: ask less often",
        )

    async def answer(self, user: str, window_seconds: int, max_batches: int) -> dict[str, Any]:
        """The price table of the last `window_seconds` (at most `max_batches` batches)."""
        now = time.monotonic()
        await self._refresh(now)
        # Windows rounded up to the minute: nearby questions share one answer.
        key = (-(-window_seconds // 60) * 60, max_batches)
        kept = self._answers.get(key)
        if kept is not None and kept[0] > now:
            return kept[1]
        self._budget.check(user, now)  # 429 when its budget is spent
        started = time.perf_counter()
        until = datetime.now(UTC)
        since = until - timedelta(seconds=key[0])
        answer = self._table(self._window(since, max_batches), since, until)
        self._budget.spend(user, now, time.perf_counter() - started)
        self._answers[key] = (now + _ANSWER_SECONDS, answer)
        self._answers.move_to_end(key)
        while len(self._answers) > _ANSWERS_KEPT:
            self._answers.popitem(last=False)
        return answer

    def _window(self, since: datetime, max_batches: int) -> list[ClearingSample]:
        """The samples of the latest `max_batches` batches closed since `since`."""
        chosen: list[ClearingSample] = []
        batches: set[str] = set()
        for sample in reversed(self._samples):
            if sample.closed_at < since:
                continue
            if sample.batch_id not in batches:
                if len(batches) == max_batches:
                    continue
                batches.add(sample.batch_id)
            chosen.append(sample)
        return chosen

    async def _refresh(self, now: float) -> None:
        if now - self._refreshed < _REFRESH_SECONDS:
            return
        async with self._refreshing:
            if now - self._refreshed < _REFRESH_SECONDS:
                return
            await asyncio.to_thread(self._read_new)
            self._refreshed = time.monotonic()

    def _read_new(self) -> None:
        """Add what cleared since the last read (the database's time, in a worker thread)."""
        if self._cursor is None:
            since = datetime.now(UTC) - HORIZON
            first = self._ledger.recent_clearing(since, _MAX_SAMPLES // 4)
            self._add(sorted(first, key=lambda s: s.closed_at))
            if self._cursor is None:
                self._cursor = since
        assert self._cursor is not None
        after = self._cursor - _OVERLAP
        while True:
            page = self._ledger.clearing_after(after, _PAGE_BATCHES)
            self._add([s for s in page if s.batch_id not in self._seen])
            if len({s.batch_id for s in page}) < _PAGE_BATCHES:
                return
            after = max(s.closed_at for s in page)

    def _add(self, samples: list[ClearingSample]) -> None:
        for sample in samples:
            self._samples.append(sample)
            self._seen[sample.batch_id] = sample.closed_at
            if self._cursor is None or sample.closed_at > self._cursor:
                self._cursor = sample.closed_at
        if self._cursor is not None:
            edge = self._cursor - _OVERLAP
            self._seen = {b: t for b, t in self._seen.items() if t >= edge}
        horizon = datetime.now(UTC) - HORIZON
        while self._samples and self._samples[0].closed_at < horizon:
            self._samples.popleft()
