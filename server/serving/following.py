"""Following a dispatched request to its outcome: its stream, its deadlines, its durable record.

A request is followed on its generation's own task (`server.engine.protocol.Driver`): the task
that reads the engine's stream hands each chunk to the request's `FollowedRequest` as it is
read, and once the stream ends it records the outcome and answers the ticket. One task per
dispatched request, with no queue between the engine's reader and the ticket.

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
rescheduled to now, so the engine's read it awaits raises `TimeoutError` exactly as a timeout of
its own would: the deadlines are those of a fresh `asyncio.timeout(min(stall, cap left))` per
chunk, without a timer per stream or per chunk.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from inference_auctions.billing import Ledger, RequestNotScheduled, ServedInput
from inference_auctions.server.engine.errors import EngineError, EngineTimeout
from inference_auctions.server.engine.protocol import EngineChunk, Generation
from inference_auctions.server.errors import EngineFailed, EngineTimedOut, ServiceError
from inference_auctions.server.ledger_writer.writer import LedgerWriter
from inference_auctions.server.metrics import Metrics
from inference_auctions.server.request_context import request_context
from inference_auctions.server.serving.admission import unavailable
from inference_auctions.server.serving.tickets import Chunk, Ticket
from inference_auctions.server.settings import ServerSettings

if TYPE_CHECKING:
    from inference_auctions.server.serving.clearing import ClearedBatch

__all__ = ["EngineLoad", "FollowedRequest", "Follower", "StreamDeadlines", "Watch"]

log = logging.getLogger(__name__)

_REASON_CHARS = 400  # the ledger keeps reasons of up to 500 characters


class EngineLoad(Protocol):
    """What counts this server's requests at the engine (`server.serving.dispatch`)."""

    def started(self, engine_rid: str) -> None:
        """The request produced its first token."""

    def freed(self, engine_rid: str) -> None:
        """The request left the engine (or failed before it started)."""

    def parked(self, followed: FollowedRequest) -> None:
        """A preempted request waits to be resumed (after `freed`)."""


class _Stalled(Exception):
    """No chunk came within the stall deadline."""


@dataclass(frozen=True, slots=True)
class _Streamed:
    final: Chunk | None  # the finishing chunk, withheld from the ticket until recorded
    ttft: float | None  # seconds from dispatch to the first chunk
    streamed: bool = False  # whether the engine sent anything at all


@dataclass
class Follower:
    """Follows dispatched requests to their end: one `FollowedRequest` per request, run on
    its generation's own task."""

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

    def follow(
        self,
        ticket: Ticket,
        batch: ClearedBatch,
        settled: asyncio.Future[bool] | None = None,
    ) -> FollowedRequest:
        """The driver of `ticket`'s generation (`server.engine.protocol.Driver`).
        `settled`: the commit's verdict on a batch sent ahead of it
        (`server.serving.dispatch_ahead`); nothing is recorded or finished before it, nothing at all
        if it is False."""
        return FollowedRequest(self, ticket, batch, settled)

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


class FollowedRequest:
    """One dispatched request, followed on its generation's task: the engine's chunks go to
    the ticket as the engine reads them, then the outcome is recorded before the last byte.
    `ended` resolves once it has been followed to its end, however it ended."""

    __slots__ = (
        "_before",
        "_final",
        "_follower",
        "_last",
        "_preempted",
        "_started",
        "_ttft",
        "_watch",
        "batch",
        "context",
        "ended",
        "settled",
        "ticket",
    )

    def __init__(
        self,
        follower: Follower,
        ticket: Ticket,
        batch: ClearedBatch,
        settled: asyncio.Future[bool] | None,
    ) -> None:
        self._follower = follower
        self.ticket = ticket
        self.batch = batch
        self.settled = settled
        # Its log lines name the request (`request_context`).
        self.context: contextvars.Context | None = request_context(ticket)
        self.ended: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._last: Chunk | None = None  # the latest chunk pushed to the ticket
        self._final: Chunk | None = None  # the finishing chunk, withheld until recorded
        self._ttft: float | None = None
        self._watch: Watch | None = None
        self._started = False  # whether its generation at the engine now produced a chunk
        # Set by `preempt`: its generation was stopped to make room for a paying request, and
        # it waits to be resumed (`server.serving.dispatch`) rather than to end.
        self._preempted = False
        # What the engine produced before it was preempted, which a resumed generation's
        # chunks continue (None: nothing yet).
        self._before: Chunk | None = None

    @property
    def produced(self) -> Chunk | None:
        """Everything the engine produced for it so far (cumulative), if anything."""
        return self._last

    def preempt(self, stop: Callable[[str], None]) -> None:
        """Stop its generation (`stop`) to make room for a paying request: it is not ended but
        parked, and resumed from what it produced so far (`server.serving.dispatch`)."""
        self._preempted = True
        stop("preempted: the engine's slot went to a paying request; it resumes later")

    def chunk(self, chunk: EngineChunk) -> None:
        """One chunk from the engine, on the generation's task: to the ticket at once, except
        the last, withheld until the outcome is recorded."""
        ticket = self.ticket
        if not self._started:
            self._started = True
            self._follower.load.started(ticket.engine_rid)
        if self._ttft is None:
            assert ticket.dispatched is not None
            self._ttft = ticket.first_token = time.monotonic() - ticket.dispatched
            self._follower.metrics.engine_ttft.observe(self._ttft)
        before = self._before
        if before is None:
            # The engine's own objects, not copies: each chunk is made afresh, and copying its
            # cumulative ids would cost time quadratic in them.
            pushed = Chunk(chunk.text, chunk.output_ids, chunk.meta_info)
        else:
            pushed = _continued(before, chunk, len(self.ticket.tokens))
        if chunk.finished:
            self._final = pushed
            return
        ticket.push(pushed)
        self._last = pushed
        if self._watch is not None:
            self._watch.waiting()  # the next chunk's stall deadline starts now

    async def drive(self, generation: Generation, produce: Awaitable[None]) -> None:
        """Run the engine's side to its end, then record the outcome and answer the ticket
        (unless it was preempted: then it waits to be resumed, by another generation)."""
        parked = False
        try:
            parked = await self._serve(generation, produce)
        finally:
            if not parked and not self.ended.done():
                self.ended.set_result(None)

    async def finish_parked(self) -> None:
        """End a preempted request that will not be resumed (its client left, the server
        stops): recorded as any request whose client left, or failed."""
        try:
            follower, ticket = self._follower, self.ticket
            if ticket.left:
                await ticket.finish(await follower._departed(ticket, self.batch))
            else:
                error = unavailable(
                    f"request {ticket.rid!r} was stopped for paying traffic and the server "
                    "stopped before it could resume"
                )
                await follower._fail(ticket, self.batch, error)
                await ticket.finish(error)
        finally:
            if not self.ended.done():
                self.ended.set_result(None)

    async def _serve(self, generation: Generation, produce: Awaitable[None]) -> bool:
        """Follow one generation of the request; True if it was preempted and waits."""
        follower, ticket, batch = self._follower, self.ticket, self.batch
        error: ServiceError | None = None
        streamed = _Streamed(None, None)
        self._started = False
        try:
            streamed = await self.stream(generation, produce)
        except _Stalled:
            generation.cancel("the auction server's stall deadline passed")
            seconds = follower.settings.engine_stall_timeout_seconds
            error = EngineTimedOut(
                f"the engine produced nothing for request {ticket.rid!r} within its deadline "
                f"({seconds:g} s without a token)"
            )
        finally:
            follower.load.freed(ticket.engine_rid)
        if self._preempted and streamed.final is None and not ticket.left:
            self._preempted = False
            self._before = self._last
            follower.load.parked(self)
            return True
        failure = generation.error
        # A generation that failed before its last chunk (one that sent its last chunk
        # and then broke reading the end of the stream was served).
        if error is None and failure is not None and streamed.final is None:
            detail = _client_words(failure, ticket)
            if isinstance(failure, EngineTimeout):
                error = EngineTimedOut(f"the engine timed out on request {ticket.rid!r}: {detail}")
            else:
                error = EngineFailed(f"the engine failed request {ticket.rid!r}: {detail}")
        if self.settled is not None and not await self.settled:
            return False  # the batch is void: it is cleared again (`server.serving.clearing`)
        if ticket.left:
            await ticket.finish(await follower._departed(ticket, batch))
            return False
        if error is None and not streamed.streamed:
            error = EngineFailed(f"the engine returned nothing for request {ticket.rid!r}")
        if error is not None:
            await follower._fail(ticket, batch, error)
            await ticket.finish(error)
            return False
        refused = await follower._record_served(ticket, streamed)
        if refused is None and streamed.final is not None:
            ticket.push(streamed.final)
        await ticket.finish(refused)
        return False

    async def stream(self, generation: Generation, produce: Awaitable[None]) -> _Streamed:
        """Run `produce` (the engine reading the request's stream, which hands each chunk to
        `chunk`) under the request's deadlines; what came of it. Raises `_Stalled`."""
        assert self.ticket.dispatched is not None
        try:
            # One scope for the whole stream, expired by the server's `StreamDeadlines`: no
            # scope per chunk, no timer per stream.
            async with asyncio.timeout(None) as scope:
                watch = self._watch = self._follower._deadlines.watch(scope)
                try:
                    await produce
                finally:
                    watch.cancel()
                    self._watch = None
        except TimeoutError:
            if self._final is not None:  # it finished as the deadline passed
                return _Streamed(self._final, self._ttft, streamed=True)
            last = self._last
            if not watch.capped or last is None:
                raise _Stalled from None
            generation.cancel("the operator's total-time cap passed")
            cap = self._follower.settings.engine_max_seconds
            return _Streamed(_capped(last, cap), self._ttft, streamed=True)
        sent = self._final is not None or self._last is not None
        return _Streamed(self._final, self._ttft, streamed=sent)


def _continued(before: Chunk, chunk: EngineChunk, prompt_tokens: int) -> Chunk:
    """A resumed generation's chunk as the client sees it: after what the engine produced
    before the preemption, counted as one answer to the original prompt."""
    meta = dict(chunk.meta_info)
    completion = meta.get("completion_tokens")
    if isinstance(completion, int) and not isinstance(completion, bool):
        meta["completion_tokens"] = completion + len(before.output_ids)
    meta["prompt_tokens"] = prompt_tokens
    return Chunk(before.text + chunk.text, before.output_ids + chunk.output_ids, meta)


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
