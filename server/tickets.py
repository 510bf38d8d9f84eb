"""A ticket follows one admitted request from its hold to its last engine chunk.

The HTTP handler that admitted it, and any retry of the same request id, read the same
ticket: they wait for its clearance (the auction's verdict), then read its chunks as the
engine produces them, or its error.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from inference_auctions.server.engine.base import TokenIds
from inference_auctions.server.errors import ServiceError


@dataclass(frozen=True, slots=True)
class Clearance:
    """Where the auction put a request, and what its user pays for the batch."""

    batch_id: str
    position: int
    batch_size: int
    priority: float
    bid_micros: int
    user_batch_charge_micros: int  # the user's whole charge for the batch
    request_charge_micros: int  # this request's share of it (SPEC section 1)
    sequence: int  # global schedule sequence number: the engine priority (lower goes first)

    def as_json(self) -> dict[str, Any]:
        """The `auction` object of the responses."""
        return {
            "batch_id": self.batch_id,
            "position": self.position,
            "batch_size": self.batch_size,
            "priority": self.priority,
            "bid_micros": self.bid_micros,
            "user_batch_charge_micros": self.user_batch_charge_micros,
            "request_charge_micros": self.request_charge_micros,
            # Deprecated alias of user_batch_charge_micros, kept for one release.
            "charge_micros": self.user_batch_charge_micros,
        }


@dataclass(frozen=True, slots=True)
class Chunk:
    """One engine chunk as SGLang sends it: cumulative text and ids, and meta_info."""

    text: str
    output_ids: list[int]
    meta_info: dict[str, Any]


@dataclass(eq=False)
class Ticket:
    """One admitted request and everything that has happened to it so far."""

    user: str
    rid: str  # as the client sent it
    ledger_rid: str  # unique across users: the hold's, the ledger's and the engine's id
    tokens: TokenIds
    bid_micros: int
    sampling_params: dict[str, Any]
    fingerprint: str  # of the payload, so a retry can be told from a conflicting reuse
    arrived: float = field(default_factory=time.monotonic)
    queued: float | None = None  # when it joined the pool, its hold placed
    closed: float | None = None  # when its batch closed
    dispatched: float | None = None  # when it was sent to the engine

    @property
    def overhead(self) -> float | None:
        """Seconds the auction layer itself took: arrival to dispatch minus the batching wait."""
        if self.queued is None or self.closed is None or self.dispatched is None:
            return None
        return (self.queued - self.arrived) + (self.dispatched - self.closed)

    @property
    def batching_wait(self) -> float | None:
        """Seconds it waited in the pool for its batch to close."""
        if self.queued is None or self.closed is None:
            return None
        return self.closed - self.queued

    clearance: Clearance | None = None
    chunks: list[Chunk] = field(default_factory=list)
    error: ServiceError | None = None
    done: bool = False
    waiters: int = 0  # HTTP handlers following it (a retry adds one)
    _changed: asyncio.Condition = field(default_factory=asyncio.Condition)

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    async def clear(self, clearance: Clearance) -> None:
        """Record the auction's verdict."""
        self.clearance = clearance
        await self._notify()

    async def push(self, chunk: Chunk) -> None:
        """Record one engine chunk."""
        self.chunks.append(chunk)
        await self._notify()

    async def finish(self, error: ServiceError | None = None) -> None:
        """Record the end: the last chunk was pushed, or the request failed with `error`."""
        self.error = error
        self.done = True
        await self._notify()

    async def wait_cleared(self) -> Clearance:
        """The clearance, once the request's batch is cleared; raises its error instead."""
        async with self._changed:
            await self._changed.wait_for(lambda: self.clearance is not None or self.done)
        if self.clearance is None:
            assert self.error is not None
            raise self.error
        return self.clearance

    async def follow(self) -> AsyncIterator[Chunk]:
        """Every chunk from the first, as they arrive; raises the error if the request fails."""
        seen = 0
        while True:
            async with self._changed:
                await self._changed.wait_for(partial(self._has_news, seen))
                fresh = self.chunks[seen:]
            seen += len(fresh)
            for chunk in fresh:
                yield chunk
            if self.done and seen == len(self.chunks):
                if self.error is not None:
                    raise self.error
                return

    def _has_news(self, seen: int) -> bool:
        return len(self.chunks) > seen or self.done

    async def result(self) -> Chunk:
        """The final chunk; raises the error if the request failed."""
        last: Chunk | None = None
        async for chunk in self.follow():
            last = chunk
        if last is None:
            raise ServiceError("the engine returned no output")
        return last
