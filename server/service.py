"""The path of one request, as one walk: hold, wait in the pool, clear, settle, dispatch.

    admit()   refuse what the engine would refuse (context length), queue the bid's hold for
              the ledger writer, join the pool, answer 402 if the hold is refused
              (`server.admission`)
    _clear()  a batch closed: claim its holds, run the auction and settle it in ONE ledger
              transaction, the writer's next group commit, which places any of its holds
              still queued first (`server.clearing`); then hand the requests to the engine in
              the auction's order. When its users can afford their queued bids as of the last
              commit, the batch is cleared at once and sent to the engine while that commit
              runs; no answer leaves before the commit settles it (`server.speculation`)
    serve     stream one request from the engine into its ticket and record its outcome
              before its last byte; on an engine failure refund what that failure is worth
              (`server.dispatch`)

A request id is the client's idempotency key: a retry with the same payload joins the same
ticket (and is never charged twice); the same id with another payload is a 409.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Coroutine
from datetime import UTC, datetime
from typing import Any, NamedTuple

from inference_auctions.billing import ClaimedBatch, Ledger
from inference_auctions.server.admission import (
    conflict,
    held,
    hold_was_placed,
    ledger_rid,
    payload_fingerprint,
    queue_hold,
    release_hold,
    unavailable,
)
from inference_auctions.server.batching import BatchingPolicy, BatchPool, PoolClosed, QueueFull
from inference_auctions.server.clearing import BatchClearing, ClearedBatch, SpeculationVoid
from inference_auctions.server.deferral import DeferralSettings
from inference_auctions.server.deferred_dispatch import DeferredDispatch
from inference_auctions.server.dispatch import Serving
from inference_auctions.server.engine.base import Engine, EngineRequest, TokenArray, TokenIds
from inference_auctions.server.engine.errors import EngineError, EngineTimeout
from inference_auctions.server.engine.generation import Generation
from inference_auctions.server.engine.sglang_request import check_context_length
from inference_auctions.server.errors import (
    Conflict,
    EngineFailed,
    EngineTimedOut,
    InvalidRequest,
    ServiceError,
    Unavailable,
)
from inference_auctions.server.ledger_writer import LedgerWriter
from inference_auctions.server.metrics import Metrics
from inference_auctions.server.settings import ServerSettings
from inference_auctions.server.speculation import Speculation
from inference_auctions.server.tickets import Clearance, Ticket

__all__ = ["AuctionService", "Load", "new_batch_id", "payload_fingerprint"]

log = logging.getLogger(__name__)

# Finished tickets kept for idempotent retries; older ones fall back to the ledger's record.
_REMEMBERED_TICKETS = 10_000

# How long a user one of whose holds was refused (the budget, spent meanwhile on another
# replica; a rid settled or held elsewhere) or could not be claimed waits for commits before
# dispatch: each such request sent ahead voids its whole batch, other users' requests included,
# and the writer's estimate of what a user can afford cannot see another replica's spending.
_DISTRUST_SECONDS = 60.0
# Distrusted users remembered before the expired ones are swept out. The next sweep waits
# for twice as many as the last one kept, so a flood of refusals naming many users costs
# amortized constant time per refusal.
_DISTRUSTED_SWEEP = 10_000


class Load(NamedTuple):
    """How busy the server is: requests waiting in its pool, and outstanding at the engine."""

    queue: int
    inflight: int


def new_batch_id() -> str:
    """Sortable by time, unique across replicas."""
    return f"b{time.time_ns():x}{secrets.token_hex(4)}"


class AuctionService:
    """Owns the pool, the engine dispatch and the tickets of one server process."""

    def __init__(
        self,
        settings: ServerSettings,
        ledger: Ledger,
        engine: Engine,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.settings = settings
        self.ledger = ledger
        self._engine = engine
        self._clock = clock
        policy = BatchingPolicy(
            batch_size=settings.batch_size,
            max_wait=settings.max_wait_ms / 1000,
            max_inflight=settings.max_inflight,
            max_queue=settings.max_queue,
        )
        self._pool: BatchPool[Ticket] = BatchPool(
            policy, self._clear, lambda: self._inflight, saturated=self._saturated
        )
        self.metrics = Metrics(
            queue_length=lambda: len(self._pool), inflight=lambda: self._inflight
        )
        self._inflight = 0
        # Sent to the engine (or held back by deferral) without a first token yet: ledger rid
        # -> prompt tokens. Their total is how saturated the engine is (`_saturated`).
        self._unstarted: dict[str, int] = {}
        self._unstarted_tokens = 0
        # Recent (overhead, batching wait) of each request, for benchmarks and operators.
        self._timings: deque[tuple[float, float]] = deque(maxlen=100_000)
        self._sequence = 0
        self._tickets: OrderedDict[tuple[str, str], Ticket] = OrderedDict()
        # User -> when they may be dispatched ahead of a commit again (`_may_dispatch_ahead`).
        self._distrusted: dict[str, float] = {}
        self._distrusted_sweep_at = _DISTRUSTED_SWEEP
        self._tasks: set[asyncio.Task[None]] = set()
        self._runner: asyncio.Task[None] | None = None
        # In-step prefix deferral: the dispatcher sends each request when the rule lets it go.
        self.dispatcher = DeferredDispatch(engine, _deferral_settings(settings), self.metrics)
        # Every ledger write of the serving path, grouped onto one thread (group commit).
        self.writer = LedgerWriter(ledger, observe_group=self.metrics.ledger_group_writes.observe)
        self._serving = Serving(
            settings, ledger, self.writer, self.metrics, self._freed, started=self._started
        )

    # What the routes ask of the service

    @property
    def engine_name(self) -> str:
        """The engine's name, as `/health` and `/server_info` report it."""
        return self._engine.name

    async def engine_healthy(self) -> bool:
        """Whether the engine answers its health check."""
        return await self._engine.health()

    async def flush_engine_cache(self) -> bool:
        """Ask the engine to empty its prefix cache; False while requests run or wait there."""
        return await self._engine.flush_cache()

    async def tokenize(self, text: str) -> TokenArray:
        """The engine's token ids for a prompt (cached, read-only)."""
        return await self._engine.tokenize_array(text)

    def load(self) -> Load:
        """Requests waiting in the pool, and outstanding at the engine, now."""
        return Load(queue=len(self._pool), inflight=self._inflight)

    def recent_timings(self) -> list[tuple[float, float]]:
        """(overhead, batching wait) in seconds of the most recent requests, oldest first."""
        return list(self._timings)

    async def start(self) -> None:
        """Start closing batches."""
        self._runner = asyncio.create_task(self._pool.run(), name="batch-pool")

    async def stop(self) -> None:
        """Drain: clear every waiting request, let every dispatched one finish, then stop."""
        await self._pool.drain()
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)
        if self._runner is not None:
            self._runner.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._runner
        self.dispatcher.close()
        await self.writer.close()

    # Admission

    async def admit(
        self,
        *,
        user: str,
        rid: str,
        tokens: TokenIds,
        bid_micros: int,
        sampling_params: dict[str, Any],
        fingerprint: str,
        streamed: bool = True,
    ) -> Ticket:
        """Hold the bid and queue the request; a retry of a known rid joins its ticket."""
        key = (user, rid)
        known = self._tickets.get(key)
        if known is not None:
            if known.fingerprint != fingerprint:
                raise conflict(rid)
            return known
        await self._check_context(tokens, sampling_params)
        ticket = Ticket(
            user=user,
            rid=rid,
            ledger_rid=ledger_rid(user, rid),
            tokens=tokens,
            bid_micros=bid_micros,
            sampling_params=sampling_params,
            fingerprint=fingerprint,
            streamed=streamed,
        )
        # Claimed before the first await, so a concurrent retry joins instead of racing.
        self._remember(key, ticket)
        try:
            # Queued before the ticket can join a batch, so the batch's claim finds the hold:
            # in the same group commit when the batch closes at once (a lone request costs one
            # ledger transaction before dispatch, not two).
            ticket.hold = queue_hold(self.writer, ticket)
            ticket.queued = time.monotonic()
            try:
                self._pool.submit(ticket)
            except (QueueFull, PoolClosed) as error:
                if await hold_was_placed(ticket):
                    await self._release(ticket, "not queued: " + str(error))
                raise unavailable(str(error)) from None
            await held(ticket.hold, self.metrics, ticket)
        except ServiceError as error:
            # Refused: if its batch has not closed, it leaves the pool; a batch that took it
            # meanwhile finds no hold to claim (or one of another payload) and leaves it out.
            self._pool.withdraw(ticket)
            if not isinstance(error, Unavailable):  # its hold was refused: see `_distrust`
                self._distrust(user)
            self._forget(key)
            await ticket.finish(error)  # a concurrent retry that joined gets the same answer
            raise
        except asyncio.CancelledError:
            # Never leave a ticket behind that nothing will finish: a retry would wait on it
            # forever. One still in the pool leaves it, its hold released once placed; one
            # whose batch closed is served and settled like a client that left after that.
            if self._pool.withdraw(ticket):
                self._forget(key)
                self._spawn(self._release_when_placed(ticket, "cancelled before dispatch"))
                await ticket.finish(unavailable("the request was cancelled before it was queued"))
            raise
        return ticket

    async def _check_context(self, tokens: TokenIds, sampling_params: dict[str, Any]) -> None:
        """Refuse, before any money moves, what the engine would refuse for its length."""
        try:
            context = await self._engine.context_length()
        except EngineTimeout as error:
            raise EngineTimedOut(f"asking the engine for its context length: {error}") from None
        except EngineError as error:
            raise EngineFailed(f"the engine did not tell its context length: {error}") from None
        if context is None:
            return
        max_new_tokens = sampling_params.get("max_new_tokens")
        try:
            check_context_length(len(tokens), max_new_tokens, context)
        except ValueError as error:
            param = "max_new_tokens" if str(error).startswith("Requested") else "prompt"
            raise InvalidRequest(str(error), param=param) from None

    async def abandon(self, ticket: Ticket) -> None:
        """The client went away: if its batch has not closed, take it back and free its hold."""
        if self._pool.withdraw(ticket):
            await self._release_when_placed(ticket, "client disconnected before dispatch")
            await ticket.finish(unavailable("the client disconnected"))
            self._forget((ticket.user, ticket.rid))

    async def _release(self, ticket: Ticket, reason: str) -> None:
        await release_hold(self.writer, self.ledger, self.metrics, ticket, reason)

    async def _release_when_placed(self, ticket: Ticket, reason: str) -> None:
        """Free the ticket's hold once its commit is known, if it was placed."""
        if await hold_was_placed(ticket):
            await self._release(ticket, reason)

    def _remember(self, key: tuple[str, str], ticket: Ticket) -> None:
        self._tickets[key] = ticket
        while len(self._tickets) > _REMEMBERED_TICKETS:
            oldest_key, oldest = next(iter(self._tickets.items()))
            if not oldest.done:
                break
            del self._tickets[oldest_key]

    def _forget(self, key: tuple[str, str]) -> None:
        self._tickets.pop(key, None)

    # Clearing

    async def _clear(self, tickets: list[Ticket]) -> None:
        closed = time.monotonic()
        for ticket in tickets:
            ticket.closed = closed
        if self._may_dispatch_ahead(tickets, closed):
            clearing = BatchClearing(tickets, new_batch_id(), self._clock)
            try:
                batch = clearing.speculate()
            except Exception:  # a bug in clearing: the claim below fails the batch cleanly
                log.exception("clearing a batch ahead of its commit failed")
            else:
                await self._dispatch_ahead(clearing, batch, tickets)
                return
        await self._clear_committed(BatchClearing(tickets, new_batch_id(), self._clock), tickets)

    def _may_dispatch_ahead(self, tickets: list[Ticket], now: float) -> bool:
        """Whether the batch may go to the engine while its settlement commits: small enough
        to clear on the event loop, and every user in it able to afford their queued bids as
        of the last commit and not recently refused a claim."""
        settings = self.settings
        if not settings.dispatch_ahead or len(tickets) > settings.dispatch_ahead_max_batch:
            return False
        return all(
            self.writer.covers(ticket.user) and self._distrusted.get(ticket.user, 0.0) <= now
            for ticket in tickets
        )

    async def _dispatch_ahead(
        self, clearing: BatchClearing, batch: ClearedBatch, tickets: list[Ticket]
    ) -> None:
        """Send the batch, cleared here, to the engine now; its commit confirms it, or it is
        cleared again (`server.speculation`). Returns once the commit has told, so that the
        pool closes the next batch, as after any settlement, with what arrived meanwhile."""
        by_rid = {ticket.ledger_rid: ticket for ticket in tickets}
        ordered = [by_rid[rid] for rid in batch.outcome.order]
        clearances = [self._clearance(batch, ticket) for ticket in ordered]
        speculation = Speculation([ticket.engine_rid for ticket in ordered])
        self.metrics.batches_ahead.inc()
        self._inflight += len(ordered)
        # Queued in this turn, so that it rides in the same commit as the holds queued in it.
        claimed = self.writer.queue_claim(clearing.claim)
        self._dispatch(ordered, clearances, batch, speculation)
        await self._confirm(clearing, claimed, tickets, ordered, clearances, speculation)

    async def _confirm(
        self,
        clearing: BatchClearing,
        claimed: asyncio.Future[ClaimedBatch],
        tickets: list[Ticket],
        ordered: list[Ticket],
        clearances: list[Clearance],
        speculation: Speculation,
    ) -> None:
        """Wait for the commit of a batch sent ahead; let its answers go, or clear it again."""
        started = time.perf_counter()
        try:
            cleared = clearing.cleared(await claimed)
        except SpeculationVoid as void:
            self.metrics.batches_voided.inc()
            log.info("a batch sent ahead of its commit is cleared again: %s", void)
            await self._void(speculation)
            for ticket in tickets:
                ticket.chunks.clear()
                ticket.resent += 1
            await self._clear_committed(
                BatchClearing(tickets, new_batch_id(), self._clock), tickets
            )
            return
        except Exception as error:
            await self._void(speculation)
            await self._fail_unsettled(tickets, error)
            return
        self.metrics.settle_seconds.observe(time.perf_counter() - started)
        assert cleared.batch is not None and not cleared.refused  # whole, or void
        self._count(cleared.batch)
        for ticket, clearance in zip(ordered, clearances, strict=True):
            await ticket.clear(clearance)
        speculation.confirm()

    async def _void(self, speculation: Speculation) -> None:
        """Take a batch sent ahead back from the engine, its requests no longer in flight."""
        for engine_rid in await speculation.void(self.dispatcher):
            self._freed(engine_rid)

    async def _clear_committed(self, clearing: BatchClearing, tickets: list[Ticket]) -> None:
        """Claim, clear and settle the batch in the writer's next commit, then dispatch it."""
        started = time.perf_counter()
        try:
            # In the writer's next group commit, after the holds queued before it: large
            # batches take tens of milliseconds there, while the event loop keeps serving.
            cleared = clearing.cleared(await self.writer.claim(clearing.claim))
        except Exception as error:
            await self._fail_unsettled(tickets, error)
            return
        self.metrics.settle_seconds.observe(time.perf_counter() - started)
        by_rid = {ticket.ledger_rid: ticket for ticket in tickets}
        for rid, state in cleared.refused.items():
            await self._refuse(by_rid[rid], state)
        batch = cleared.batch
        if batch is None:
            return
        self._count(batch)
        ordered = [by_rid[rid] for rid in batch.outcome.order]
        clearances = [self._clearance(batch, ticket) for ticket in ordered]
        for ticket, clearance in zip(ordered, clearances, strict=True):
            await ticket.clear(clearance)
        self._inflight += len(ordered)
        self._dispatch(ordered, clearances, batch)

    async def _fail_unsettled(self, tickets: list[Ticket], error: Exception) -> None:
        """The batch could not be settled: its requests fail, nothing charged."""
        self.metrics.ledger_errors.labels(operation="settle").inc()
        log.error("settling a batch failed; its requests fail unserved: %s", error)
        failure = unavailable("the ledger could not settle the batch; nothing was charged")
        for ticket in tickets:
            if ticket.done:  # its own hold was refused: admission answered it
                continue
            await self._release_when_placed(ticket, "batch could not be settled")
            await ticket.finish(failure)
            # A retry of the rid is admitted afresh (its hold re-opened) instead of
            # replaying this failure.
            self._forget((ticket.user, ticket.rid))

    def _count(self, batch: ClearedBatch) -> None:
        outcome = batch.outcome
        self.metrics.auction_seconds.observe(batch.auction_seconds)
        self.metrics.batches.inc()
        self.metrics.batch_size.observe(outcome.size)
        self.metrics.revenue.inc(outcome.revenue)
        self.metrics.welfare.inc(int(outcome.welfare))

    async def _refuse(self, ticket: Ticket, state: str) -> None:
        """A request whose hold could not be claimed leaves its batch with its own error."""
        if ticket.done or not await hold_was_placed(ticket):
            return  # its hold was refused in the same commit: admission answered it
        error: ServiceError
        if state == "settled":
            error = Conflict(
                f"request id {ticket.rid!r} was settled in another batch (sent twice, e.g. to "
                "two servers); use a new rid for a new request",
                param="rid",
            )
        elif state == "conflict":
            error = conflict(ticket.rid)
        else:  # released (expired) meanwhile: nothing was charged, a retry is admitted afresh
            error = unavailable(
                f"the hold of request {ticket.rid!r} was {state} before its batch closed; "
                "nothing was charged, retry"
            )
            self._forget((ticket.user, ticket.rid))
        log.info("request %r left its batch: hold %s", ticket.rid, state)
        self._distrust(ticket.user)
        await ticket.finish(error)

    def _distrust(self, user: str) -> None:
        """The user's next batches wait for their commits before the engine sees them."""
        now = time.monotonic()
        if len(self._distrusted) >= self._distrusted_sweep_at:
            self._distrusted = {u: t for u, t in self._distrusted.items() if t > now}
            self._distrusted_sweep_at = max(_DISTRUSTED_SWEEP, 2 * len(self._distrusted))
        self._distrusted[user] = now + _DISTRUST_SECONDS

    def _clearance(self, batch: ClearedBatch, ticket: Ticket) -> Clearance:
        sequence = self._sequence
        self._sequence += 1
        outcome = batch.outcome
        return Clearance(
            batch_id=batch.batch_id,
            position=outcome.positions[ticket.ledger_rid],
            batch_size=outcome.size,
            priority=float(outcome.priority(ticket.ledger_rid)),
            bid_micros=ticket.bid_micros,
            user_batch_charge_micros=batch.charge(ticket.user),
            request_charge_micros=batch.shares[ticket.ledger_rid],
            sequence=sequence,
        )

    # Dispatch

    def _spawn(self, work: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _dispatch(
        self,
        ordered: list[Ticket],
        clearances: list[Clearance],
        batch: ClearedBatch,
        speculation: Speculation | None = None,
    ) -> None:
        """Hand the batch to the engine in the auction's order; follow each request."""
        requests = []
        now = time.monotonic()
        for ticket, clearance in zip(ordered, clearances, strict=True):
            ticket.dispatched = now
            self._unstarted[ticket.engine_rid] = len(ticket.tokens)
            self._unstarted_tokens += len(ticket.tokens)
            self.metrics.dispatch_lag.observe(now - ticket.arrived)
            if ticket.overhead is not None and ticket.batching_wait is not None:
                self.metrics.overhead.observe(ticket.overhead)
                self._timings.append((ticket.overhead, ticket.batching_wait))
            requests.append(
                EngineRequest(
                    rid=ticket.engine_rid,
                    input_ids=ticket.tokens,
                    sampling_params=self._engine_sampling(ticket),
                    priority=clearance.sequence,
                    stream=True,
                )
            )
        settled = None if speculation is None else speculation.settled

        def follow(place: int, generation: Generation) -> None:
            task = self._spawn(self._serving.serve(ordered[place], generation, batch, settled))
            if speculation is not None:
                speculation.follow(generation, task)

        self.dispatcher.dispatch(batch.outcome, requests, follow)

    def _engine_sampling(self, ticket: Ticket) -> dict[str, Any]:
        """The sampling parameters sent to the engine. Every request is streamed from the
        engine, so that its first token is seen (saturation, deferral); one whose client
        waits for the whole answer asks for a chunk per `engine_stream_interval` tokens
        instead of one per token (SGLang's per-request `stream_interval`: the first token, then
        every k-th), which spares both processes most of the per-chunk work."""
        if ticket.streamed:
            return ticket.sampling_params
        return {**ticket.sampling_params, "stream_interval": self.settings.engine_stream_interval}

    def _started(self, engine_rid: str) -> None:
        self._unstarted_tokens -= self._unstarted.pop(engine_rid, 0)
        self.dispatcher.first_token(engine_rid)  # a request held back for its prefix may go
        self._pool.wake()

    def _freed(self, engine_rid: str) -> None:
        self._unstarted_tokens -= self._unstarted.pop(engine_rid, 0)  # failed before starting
        self.dispatcher.ended(engine_rid)  # a request held back for this one's prefix may go
        self._inflight -= 1
        self._pool.wake()

    def _saturated(self) -> bool:
        """Whether the engine has about a prefill step's worth of requests it has not started."""
        return (
            self._unstarted_tokens >= self.settings.saturation_tokens
            or len(self._unstarted) >= self.settings.saturation_requests
        )


def _deferral_settings(settings: ServerSettings) -> DeferralSettings | None:
    """The deferral rule's settings; None when it is off or cannot apply (ordered mode)."""
    if not settings.deferral or settings.engine_mode != "priority":
        return None
    return DeferralSettings(settings.deferral_tokens, settings.deferral_max_hold_ms / 1000)
