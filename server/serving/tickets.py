"""A ticket follows one admitted request from its hold to its last engine chunk.

The HTTP handler that admitted it, and any retry of the same request id, read the same
ticket: they wait for its clearance (the auction's verdict), then read its chunks as the
engine produces them, or its error.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from inference_auctions.billing import HoldView
from inference_auctions.server.engine.protocol import TokenIds, Waiters
from inference_auctions.server.errors import ServiceError

_RECENT_CHUNKS = 4  # chunks a slow reader can still read one by one; past them it skips


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
    # The engine priority (lower goes first): the global schedule sequence number, or under
    # `tiers` the tier's (`server.serving.tiers`).
    sequence: int
    request_fee_micros: int = 0  # the fee this request pays besides its charge (SPEC section 5)
    pricing: str = "auction"  # the server's pricing mode
    service_tier: str | None = None  # the request's tier, under `tiers`
    # Under a posted price floor: what this request pays of it besides its charge (SPEC 7).
    floor_micros: int | None = None

    def as_json(self) -> dict[str, Any]:
        """The `auction` object of the responses."""
        extra: dict[str, Any] = {}
        if self.pricing != "auction":  # the auction's answers stay as they were
            extra = {"pricing": self.pricing, "service_tier": self.service_tier}
        if self.floor_micros is not None:
            extra["floor_micros"] = self.floor_micros
        return {
            **extra,
            "batch_id": self.batch_id,
            "position": self.position,
            "batch_size": self.batch_size,
            "priority": self.priority,
            "bid_micros": self.bid_micros,
            "user_batch_charge_micros": self.user_batch_charge_micros,
            "request_charge_micros": self.request_charge_micros,
            "request_fee_micros": self.request_fee_micros,
            # Deprecated alias of user_batch_charge_micros, kept for one release.
            "charge_micros": self.user_batch_charge_micros,
        }


@dataclass(frozen=True, slots=True)
class Chunk:
    """One engine chunk as SGLang sends it: cumulative text and ids, and meta_info."""

    text: str
    output_ids: list[int]
    meta_info: dict[str, Any]


@dataclass(eq=False, slots=True)
class Ticket:
    """One admitted request and everything that has happened to it so far."""

    user: str
    rid: str  # as the client sent it
    ledger_rid: str  # unique across users: the hold's, the ledger's and the engine's id
    tokens: TokenIds
    bid_micros: int
    sampling_params: dict[str, Any]
    fingerprint: str  # of the payload, so a retry can be told from a conflicting reuse
    # The request fee of the rule it is admitted under, held with its bid.
    fee_micros: int = 0
    # Whether its client reads the answer as a stream (a retry that joins it may differ: it
    # then reads the stream this one asked the engine for).
    streamed: bool = True
    arrived: float = field(default_factory=time.monotonic)
    queued: float | None = None  # when it joined the pool, its hold placed
    closed: float | None = None  # when its batch closed
    dispatched: float | None = None  # when it was sent to the engine
    # Its hold on its way to the ledger, queued before the ticket joins the pool.
    hold: asyncio.Future[HoldView] | None = None
    # Times it was sent to the engine in a batch that was then cleared again
    # (`server.serving.dispatch_ahead`); each time goes to the engine under a rid of its own.
    resent: int = 0
    # The `x-request-id` of the HTTP request that admitted it, and the W3C trace headers its
    # client sent as header lines (`server.request_context`): for the log lines written while
    # it is followed at the engine, and for the engine's request.
    request_id: str | None = None
    trace_headers: bytes = b""

    @property
    def engine_rid(self) -> str:
        """The request's id at the engine: its ledger rid, suffixed once it is sent again
        (the engine may still know a cancelled rid for a moment and refuse it twice)."""
        return self.ledger_rid if not self.resent else f"{self.ledger_rid}~{self.resent}"

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
    # Only its latest few chunks: chunks are cumulative (each holds the whole text so far), so
    # keeping every one would cost memory quadratic in the answer's length.
    last_chunk: Chunk | None = None
    chunk_count: int = 0
    _recent: deque[Chunk] = field(default_factory=lambda: deque(maxlen=_RECENT_CHUNKS))
    error: ServiceError | None = None
    done: bool = False
    waiters: int = 0  # HTTP handlers following it (a retry adds one)
    # Set once every client following it left after its batch closed (`server.serving.dispatch`);
    # `stop` ends its generation at the engine once it was sent.
    left: bool = False
    stop: Callable[[str], None] | None = None
    first_token: float | None = None  # seconds from dispatch to its first token, once produced
    # Called once each, when it ends: what it held is released (`server.serving.admission`,
    # `server.serving.pool`).
    on_finish: list[Callable[[], None]] = field(default_factory=list)
    # The readers waiting for each kind of change (`server.engine.protocol`): each wakes once per
    # change, and one that is cancelled cancels only its own wait.
    _on_cleared: Waiters = field(default_factory=Waiters)
    _on_chunk: Waiters = field(default_factory=Waiters)
    _on_done: Waiters = field(default_factory=Waiters)

    async def clear(self, clearance: Clearance) -> None:
        """Record the auction's verdict."""
        self.clearance = clearance
        self._on_cleared.wake()

    def push(self, chunk: Chunk) -> None:
        """Record one engine chunk (it replaces the one before: chunks are cumulative)."""
        self.last_chunk = chunk
        self.chunk_count += 1
        self._recent.append(chunk)
        self._on_chunk.wake()

    def forget_chunks(self) -> None:
        """Drop what the engine sent (it is sent again, from the start)."""
        self.last_chunk = None
        self.chunk_count = 0
        self._recent.clear()

    async def finish(self, error: ServiceError | None = None) -> None:
        """Record the end: the last chunk was pushed, or the request failed with `error`."""
        self.error = error
        self.done = True
        on_finish, self.on_finish = self.on_finish, []
        for release in on_finish:
            release()
        self._on_cleared.wake()
        self._on_chunk.wake()
        self._on_done.wake()

    def when_cleared(self) -> asyncio.Future[None]:
        """A future of this reader's own, resolved once the batch is cleared or the request
        ended (at once if it already has); then `cleared()` says how. The reader may cancel
        it, or fail it, without affecting any other reader."""
        if self.clearance is None and not self.done:
            return self._on_cleared.wait()
        future = asyncio.get_running_loop().create_future()
        future.set_result(None)
        return future

    def cleared(self) -> Clearance:
        """The clearance, once `when_cleared()` resolved; raises the request's error instead."""
        if self.clearance is None:
            assert self.error is not None
            raise self.error
        return self.clearance

    async def wait_cleared(self) -> Clearance:
        """The clearance, once the request's batch is cleared; raises its error instead."""
        await self.when_cleared()
        return self.cleared()

    async def follow(self) -> AsyncIterator[Chunk]:
        """The chunks as they arrive, the latest whenever there is a new one (a reader that
        falls behind skips to it: each chunk holds everything before it); raises the error if
        the request fails."""
        seen = 0
        while True:
            if self.chunk_count == seen and not self.done:
                await self._on_chunk.wait()
                continue
            if self.chunk_count != seen:
                behind = self.chunk_count - seen
                if behind > len(self._recent):  # fell far behind: skip to the latest
                    seen = self.chunk_count - 1
                    behind = 1
                seen += 1
                yield self._recent[-behind]
                continue
            if self.error is not None:
                raise self.error
            return

    def when_done(self) -> asyncio.Future[None]:
        """A future of this reader's own, resolved once the request ended (as `when_cleared`)."""
        if not self.done:
            return self._on_done.wait()
        future = asyncio.get_running_loop().create_future()
        future.set_result(None)
        return future

    async def result(self) -> Chunk:
        """The final chunk; raises the error if the request failed."""
        # Waits for the end only: a non-streamed reader has no use for the chunks before it.
        if not self.done:
            await self._on_done.wait()
        if self.error is not None:
            raise self.error
        if self.last_chunk is None:
            raise ServiceError("the engine returned no output")
        return self.last_chunk
