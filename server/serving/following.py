"""Following a dispatched request to its outcome: its stream, its deadlines, its durable record.

The engine's chunks go to the ticket as they come, except the last: that one is withheld until
the request's outcome is committed to the ledger (`served`, moving it out of `scheduled` only
if it is still there). If that commit fails, or crash recovery failed and refunded the request
first, the client gets a 503 instead of the end of its answer. A request that fails at the
engine is recorded `failed` together with its refund, in one transaction.

A request sent to the engine ahead of its batch's commit (`server.serving.dispatch_ahead`) is
streamed the same way, but its follower writes nothing about it (`served`, a refund, its end) before
that commit settled the batch; if it did not, the follower lets the request go untouched, and
it is cleared again (`server.serving.clearing`).

Two deadlines: the stall deadline (no token for `engine_stall_timeout_seconds`) fails the
request, refunded; the operator's total cap (`engine_max_seconds`) ends it *served*, with the
output so far and `finish_reason` `abort`, as SGLang reports an aborted request.

`StreamDeadlines`: the stall and total deadlines of every stream a server follows, on one
timer.

Every stream has the same stall period and the same total cap (the server's settings), so the
streams ordered by when they last waited for a chunk are also ordered by their stall
deadlines, and the streams ordered by when they started are ordered by their total deadlines.
Two insertion-ordered dicts keep those two orders at O(1) per chunk (a stream that waits
again moves to the end), and one timer, armed for the earliest deadline of all, expires what
is due when it fires and re-arms for the next. A stream expires through its own timeout scope,
rescheduled to now, so the `anext` it awaits raises `TimeoutError` exactly as a timeout of its
own would: the deadlines are those of a fresh `asyncio.timeout(min(stall, cap left))` per
chunk, without a timer per stream or per chunk.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from inference_auctions.billing import Ledger, RequestNotScheduled, ServedInput
from inference_auctions.server.engine.errors import EngineError, EngineTimeout
from inference_auctions.server.engine.protocol import EngineChunk, Generation
from inference_auctions.server.errors import EngineFailed, EngineTimedOut, ServiceError
from inference_auctions.server.ledger_writer.writer import LedgerWriter
from inference_auctions.server.metrics import Metrics
from inference_auctions.server.serving.admission import unavailable
from inference_auctions.server.serving.tickets import Chunk, Ticket
from inference_auctions.server.settings import ServerSettings

if TYPE_CHECKING:
    from inference_auctions.server.serving.clearing import ClearedBatch

__all__ = ["EngineLoad", "Follower", "StreamDeadlines", "Watch"]

log = logging.getLogger(__name__)

_REASON_CHARS = 400  # the ledger keeps reasons of up to 500 characters


class EngineLoad(Protocol):
    """What counts this server's requests at the engine (`server.serving.dispatch`)."""

    def started(self, engine_rid: str) -> None:
        """The request produced its first token."""

    def freed(self, engine_rid: str) -> None:
        """The request left the engine (or failed before it started)."""


class _Stalled(Exception):
    """No chunk came within the stall deadline."""


@dataclass(frozen=True, slots=True)
class _Streamed:
    final: Chunk | None  # the finishing chunk, withheld from the ticket until recorded
    ttft: float | None  # seconds from dispatch to the first chunk
    streamed: bool = False  # whether the engine sent anything at all


@dataclass
class Follower:
    """Follows dispatched requests to their end (one `serve` task per request)."""

    settings: ServerSettings
    ledger: Ledger
    writer: LedgerWriter
    metrics: Metrics
    load: EngineLoad  # told when a request starts at the engine, and when it leaves it
    # Every stream's stall and total deadlines, on one timer (`StreamDeadlines`).
    _deadlines: StreamDeadlines = field(init=False)

    def __post_init__(self) -> None:
        settings = self.settings
        self._deadlines = StreamDeadlines(
            settings.engine_stall_timeout_seconds, settings.engine_max_seconds
        )

    async def serve(
        self,
        ticket: Ticket,
        generation: Generation,
        batch: ClearedBatch,
        settled: asyncio.Future[bool] | None = None,
    ) -> None:
        """Stream the generation into the ticket; record the outcome before the last byte.
        `settled`: the commit's verdict on a batch sent ahead of it
        (`server.serving.dispatch_ahead`); nothing is recorded or finished before it, nothing at all
        if it is False."""
        error: ServiceError | None = None
        streamed = _Streamed(None, None)
        try:
            streamed = await self._stream(ticket, generation)
        except _Stalled:
            generation.cancel("the auction server's stall deadline passed")
            seconds = self.settings.engine_stall_timeout_seconds
            error = EngineTimedOut(
                f"the engine produced nothing for request {ticket.rid!r} within its deadline "
                f"({seconds:g} s without a token)"
            )
        except EngineTimeout as failure:
            detail = _client_words(failure, ticket)
            error = EngineTimedOut(f"the engine timed out on request {ticket.rid!r}: {detail}")
        except EngineError as failure:
            detail = _client_words(failure, ticket)
            error = EngineFailed(f"the engine failed request {ticket.rid!r}: {detail}")
        finally:
            self.load.freed(ticket.engine_rid)
        if settled is not None and not await settled:
            return  # the batch is void: it is cleared again (`server.serving.clearing`)
        if ticket.left:
            await ticket.finish(await self._departed(ticket, batch))
            return
        if error is None and not streamed.streamed:
            error = EngineFailed(f"the engine returned nothing for request {ticket.rid!r}")
        if error is not None:
            await self._fail(ticket, batch, error)
            await ticket.finish(error)
            return
        refused = await self._record_served(ticket, streamed)
        if refused is None and streamed.final is not None:
            await ticket.push(streamed.final)
        await ticket.finish(refused)

    async def _stream(self, ticket: Ticket, generation: Generation) -> _Streamed:
        assert ticket.dispatched is not None
        chunks: AsyncIterator[EngineChunk] = generation.chunks().__aiter__()
        last: Chunk | None = None
        ttft: float | None = None
        try:
            # One scope for the whole stream, expired by the server's `StreamDeadlines`: no
            # scope per chunk, no timer per stream.
            async with asyncio.timeout(None) as scope:
                deadlines = self._deadlines.watch(scope)
                try:
                    while True:
                        deadlines.waiting()
                        try:
                            engine_chunk = await anext(chunks)
                        except StopAsyncIteration:
                            return _Streamed(None, ttft, streamed=last is not None)
                        if ttft is None:
                            ttft = ticket.first_token = time.monotonic() - ticket.dispatched
                            self.metrics.engine_ttft.observe(ttft)
                            self.load.started(ticket.engine_rid)
                        # The engine's own objects, not copies: each chunk is made afresh,
                        # and copying its cumulative ids would cost time quadratic in them.
                        chunk = Chunk(
                            engine_chunk.text, engine_chunk.output_ids, engine_chunk.meta_info
                        )
                        if engine_chunk.finished:
                            return _Streamed(chunk, ttft, streamed=True)  # withheld until recorded
                        await ticket.push(chunk)
                        last = chunk
                finally:
                    deadlines.cancel()
        except TimeoutError:
            if not deadlines.capped or last is None:
                raise _Stalled from None
            generation.cancel("the operator's total-time cap passed")
            cap = self.settings.engine_max_seconds
            assert cap is not None
            return _Streamed(_capped(last, cap), ttft, streamed=True)

    async def _record_served(self, ticket: Ticket, streamed: _Streamed) -> ServiceError | None:
        """Commit `served`; the error to answer instead if that fails (None: committed)."""
        final = streamed.final or ticket.last_chunk
        meta = {} if final is None else final.meta_info
        cached = meta.get("cached_tokens")
        cached_tokens = (
            min(max(cached, 0), len(ticket.tokens))
            if isinstance(cached, int) and not isinstance(cached, bool)
            else None
        )
        ttft_ms = None if streamed.ttft is None else streamed.ttft * 1000
        try:
            recorded = await self.writer.served(
                ServedInput(ticket.ledger_rid, cached_tokens, ttft_ms)
            )
        except Exception as failure:
            self.metrics.ledger_errors.labels(operation="record").inc()
            self.metrics.count_request("failed")
            log.error("recording request %r served failed: %s", ticket.rid, failure)
            return unavailable(
                f"the answer to request {ticket.rid!r} could not be recorded; it counts as "
                "unserved and will be refunded; send it again with a new rid"
            )
        if not recorded:
            self.metrics.count_request("failed")
            log.warning("request %r was recorded unserved (recovery) before its answer", ticket.rid)
            return unavailable(
                f"request {ticket.rid!r} was counted unserved and refunded before its answer "
                "could be recorded; send it again with a new rid"
            )
        self.metrics.count_request("served")
        self.metrics.record_cache(
            int(meta.get("prompt_tokens", len(ticket.tokens))), cached_tokens or 0
        )
        return None

    async def _departed(self, ticket: Ticket, batch: ClearedBatch) -> ServiceError:
        """Record a request whose client left (`server.serving.dispatch`) by the rule of
        docs/SPEC.md, "A client that leaves"; the error its ticket ends with."""
        if ticket.first_token is None:
            error = unavailable(
                f"the client of request {ticket.rid!r} left before its first token; it was "
                "stopped and refunded"
            )
            await self._fail(ticket, batch, error, cause="client")
            return error
        self.metrics.count_request("abandoned")
        try:
            await self.writer.call(
                self.ledger.record_abandoned, ticket.ledger_rid, None, ticket.first_token * 1000
            )
        except RequestNotScheduled:  # recovery failed and refunded it first
            log.info("request %r was already recorded unserved", ticket.rid)
        except Exception as failure:  # it stays scheduled: `refund-unserved` refunds it
            self.metrics.ledger_errors.labels(operation="record").inc()
            log.error("recording request %r abandoned failed: %s", ticket.rid, failure)
        return unavailable(
            f"the client of request {ticket.rid!r} left before its answer was complete; it "
            "was stopped and keeps its charge"
        )

    async def _fail(
        self, ticket: Ticket, batch: ClearedBatch, error: ServiceError, cause: str = "engine"
    ) -> None:
        """Record the request failed and refund what its failure is worth, at once."""
        self.metrics.count_request("failed")
        target = batch.refund_after_failure(ticket.user, ticket.ledger_rid)
        try:
            await self.writer.call(
                self.ledger.record_failed,
                ticket.ledger_rid,
                batch.batch_id,
                ticket.user,
                target_micros=target,
                reason=f"{cause}: {error.message}"[:_REASON_CHARS],
            )
        except RequestNotScheduled:  # recovery failed and refunded it first
            log.info("request %r was already recorded unserved", ticket.rid)
        except Exception as failure:  # it stays scheduled: `refund-unserved` refunds it
            self.metrics.ledger_errors.labels(operation="refund").inc()
            log.error(
                "recording request %r failed (refund owed, run refund-unserved): %s",
                ticket.rid,
                failure,
            )


def _client_words(failure: EngineError, ticket: Ticket) -> str:
    """The engine's message, naming the request by the client's rid, not the ledger's id."""
    return (
        str(failure).replace(ticket.engine_rid, ticket.rid).replace(ticket.ledger_rid, ticket.rid)
    )


def _capped(last: Chunk, cap: float | None) -> Chunk:
    """The last chunk, finished as SGLang finishes an aborted request."""
    reason = {"type": "abort", "message": f"the server's total-time cap of {cap:g} s passed"}
    return Chunk(last.text, last.output_ids, {**last.meta_info, "finish_reason": reason})


class Watch:
    """One stream's place in `StreamDeadlines`."""

    __slots__ = ("_owner", "cap_at", "capped", "scope", "since")

    def __init__(
        self, owner: StreamDeadlines, scope: asyncio.Timeout, now: float, cap_at: float | None
    ) -> None:
        self._owner = owner
        self.scope = scope
        self.since = now  # when it last started waiting for a chunk
        self.cap_at = cap_at
        self.capped = False  # expired by the total cap (else, if expired, by the stall)

    def waiting(self) -> None:
        """The next chunk is awaited from now: its stall deadline starts now."""
        self._owner._waiting(self)

    def cancel(self) -> None:
        """The stream ended (or timed out): no deadline applies to it any more."""
        self._owner._forget(self)


class StreamDeadlines:
    """The deadlines of every stream of a server (see the module docstring)."""

    def __init__(self, stall: float, cap: float | None) -> None:
        self._stall = stall
        self._cap = cap
        self._by_wait: dict[Watch, None] = {}  # in the order they last started waiting
        self._by_start: dict[Watch, None] = {}  # in the order they started (with a cap only)
        self._timer: asyncio.TimerHandle | None = None
        self._armed_at = 0.0

    def __len__(self) -> int:
        return len(self._by_wait)

    def watch(self, scope: asyncio.Timeout) -> Watch:
        """Follow a stream that starts now and waits for its first chunk; `scope` is the
        timeout scope around it, expired when a deadline passes."""
        loop = asyncio.get_running_loop()
        now = loop.time()
        watch = Watch(self, scope, now, None if self._cap is None else now + self._cap)
        self._by_wait[watch] = None
        if watch.cap_at is not None:
            self._by_start[watch] = None
        self._arm(loop)
        return watch

    def _waiting(self, watch: Watch) -> None:
        if self._by_wait.pop(watch, False) is not False:  # still followed: to the end
            watch.since = asyncio.get_running_loop().time()
            self._by_wait[watch] = None

    def _forget(self, watch: Watch) -> None:
        self._by_wait.pop(watch, None)
        self._by_start.pop(watch, None)
        # The timer stays armed: it finds nothing due, and re-arms or stops.

    def _due(self) -> float | None:
        """The earliest deadline of every stream followed, or None when there is none."""
        due = None
        if self._by_wait:
            due = next(iter(self._by_wait)).since + self._stall
        if self._by_start:
            cap_at = next(iter(self._by_start)).cap_at
            assert cap_at is not None
            due = cap_at if due is None else min(due, cap_at)
        return due

    def _arm(self, loop: asyncio.AbstractEventLoop) -> None:
        due = self._due()
        if due is None:
            return
        if self._timer is not None:
            if self._armed_at <= due:
                return  # it fires first anyway, and re-arms then
            self._timer.cancel()
        self._armed_at = due
        self._timer = loop.call_at(due, self._fire)

    def _fire(self) -> None:
        loop = asyncio.get_running_loop()
        now = loop.time()
        # Due: whatever was due when the timer was armed for this moment, even if the clock
        # reads a hair before it.
        limit = max(now, self._armed_at)
        self._timer = None
        # The cap first: a stream past both deadlines counts as capped.
        while self._by_start:
            first = next(iter(self._by_start))
            assert first.cap_at is not None
            if first.cap_at > limit:
                break
            first.capped = True
            self._expire(first, now)
        while self._by_wait:
            first = next(iter(self._by_wait))
            if first.since + self._stall > limit:
                break
            self._expire(first, now)
        self._arm(loop)

    def _expire(self, watch: Watch, now: float) -> None:
        self._forget(watch)
        watch.scope.reschedule(now)
