"""The path of one request, as one walk: hold, wait in the pool, clear, settle, dispatch.

    admit()   hold the bid in the ledger (402 if the budget cannot cover it), join the pool
    _clear()  a batch closed: run the auction, settle it in ONE ledger transaction, then
              hand the requests to the engine in the auction's order
    _serve()  stream one request from the engine into its ticket; on an engine failure
              refund the user's charge for that batch

A request id is the client's idempotency key: a retry with the same payload joins the same
ticket (and is never charged twice); the same id with another payload is a 409.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import secrets
import time
from collections import OrderedDict, defaultdict, deque
from collections.abc import Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any

from billing import Ledger
from billing.errors import LedgerError
from billing.models import HoldState
from billing.records import BatchRecord, RequestCompletion, RequestRecord
from server.auction import AuctionOutcome, AuctionRequest, run_auction
from server.batching import BatchingPolicy, BatchPool, PoolClosed, QueueFull
from server.deferral import DeferralSettings
from server.deferred_dispatch import DeferredDispatch
from server.engine.base import Engine, EngineRequest
from server.engine.errors import EngineError, EngineTimeout
from server.engine.generation import Generation
from server.errors import (
    EngineFailed,
    EngineTimedOut,
    IdempotencyConflict,
    ServiceError,
    Unavailable,
    from_ledger_error,
)
from server.metrics import Metrics
from server.settings import ServerSettings
from server.tickets import Chunk, Clearance, Ticket

log = logging.getLogger(__name__)

# Finished tickets kept for idempotent retries; older ones fall back to the ledger's record.
_REMEMBERED_TICKETS = 10_000


def payload_fingerprint(payload: dict[str, Any]) -> str:
    """A stable digest of a request's payload (what a retry must repeat exactly)."""
    canonical = json.dumps(payload, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()


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
        self.engine = engine
        self._clock = clock
        policy = BatchingPolicy(
            batch_size=settings.batch_size,
            max_wait=settings.max_wait_ms / 1000,
            max_inflight=settings.max_inflight,
            max_queue=settings.max_queue,
        )
        self.pool: BatchPool[Ticket] = BatchPool(policy, self._clear, lambda: self.inflight)
        self.metrics = Metrics(queue_length=lambda: len(self.pool), inflight=lambda: self.inflight)
        self.inflight = 0
        # Recent (overhead, batching wait) of each request, for benchmarks and operators.
        self.timings: deque[tuple[float, float]] = deque(maxlen=100_000)
        self._sequence = 0
        self._tickets: OrderedDict[tuple[str, str], Ticket] = OrderedDict()
        self._completions: defaultdict[str, list[RequestCompletion]] = defaultdict(list)
        self._tasks: set[asyncio.Task[None]] = set()
        self._runner: asyncio.Task[None] | None = None
        # Clearing has a thread of its own: in the shared pool it would queue behind the holds
        # of the very requests that are waiting for it.
        self._clearing = ThreadPoolExecutor(max_workers=1, thread_name_prefix="clearing")
        # In-step prefix deferral: the dispatcher sends each request when the rule lets it go.
        self.dispatcher = DeferredDispatch(engine, _deferral_settings(settings), self.metrics)

    async def start(self) -> None:
        """Start closing batches."""
        self._runner = asyncio.create_task(self.pool.run(), name="batch-pool")

    async def stop(self) -> None:
        """Drain: clear every waiting request, let every dispatched one finish, then stop."""
        await self.pool.drain()
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)
        if self._runner is not None:
            self._runner.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._runner
        self._clearing.shutdown(wait=True)
        self.dispatcher.close()

    # Admission

    async def admit(
        self,
        *,
        user: str,
        rid: str,
        tokens: list[int],
        bid_micros: int,
        sampling_params: dict[str, Any],
        fingerprint: str,
    ) -> Ticket:
        """Hold the bid and queue the request; a retry of a known rid joins its ticket."""
        key = (user, rid)
        known = self._tickets.get(key)
        if known is not None:
            if known.fingerprint != fingerprint:
                raise IdempotencyConflict(
                    f"request id {rid!r} was already used with a different payload", param="rid"
                )
            return known
        ticket = Ticket(
            user=user,
            rid=rid,
            ledger_rid=f"{user}/{rid}",
            tokens=tokens,
            bid_micros=bid_micros,
            sampling_params=sampling_params,
            fingerprint=fingerprint,
        )
        # Claimed before the first await, so a concurrent retry joins instead of racing.
        self._remember(key, ticket)
        try:
            await self._hold(ticket)
            ticket.queued = time.monotonic()
            try:
                self.pool.submit(ticket)
            except (QueueFull, PoolClosed) as error:
                await self._release(ticket, "not queued: " + str(error))
                raise Unavailable(str(error), headers={"Retry-After": "1"}) from None
        except ServiceError as error:
            self._forget(key)
            await ticket.finish(error)  # a concurrent retry that joined gets the same answer
            raise
        return ticket

    async def _hold(self, ticket: Ticket) -> None:
        try:
            hold = await asyncio.to_thread(
                self.ledger.place_hold, ticket.user, ticket.ledger_rid, ticket.bid_micros
            )
        except LedgerError as error:
            raise from_ledger_error(error) from None
        except Exception as error:  # the database is down or locked: nothing was written
            self.metrics.ledger_errors.labels(operation="hold").inc()
            log.warning("placing a hold failed: %s", error)
            raise Unavailable(
                "the ledger is unavailable; retry shortly", headers={"Retry-After": "1"}
            ) from None
        if hold.state != HoldState.OPEN:
            # The hold of this rid was settled or released before (this process forgot the
            # ticket, e.g. after a restart): its result is gone, so a replay cannot be served.
            raise IdempotencyConflict(
                f"request id {ticket.rid!r} was already {hold.state} in batch {hold.batch_id}; "
                "use a new rid for a new request",
                param="rid",
            )

    async def abandon(self, ticket: Ticket) -> None:
        """The client went away: if its batch has not closed, take it back and free its hold."""
        if self.pool.withdraw(ticket):
            await self._release(ticket, "client disconnected before dispatch")
            await ticket.finish(Unavailable("the client disconnected"))
            self._forget((ticket.user, ticket.rid))

    async def _release(self, ticket: Ticket, reason: str) -> None:
        try:
            await asyncio.to_thread(self.ledger.release, ticket.ledger_rid, reason)
        except Exception as error:  # the stale-hold job frees it later
            self.metrics.ledger_errors.labels(operation="release").inc()
            log.warning("releasing hold %s failed: %s", ticket.ledger_rid, error)

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
        batch_id = new_batch_id()
        by_rid = {ticket.ledger_rid: ticket for ticket in tickets}
        requests = [AuctionRequest(t.ledger_rid, t.user, t.tokens, t.bid_micros) for t in tickets]
        started = time.perf_counter()
        # Large batches take tens of milliseconds: keep the event loop serving meanwhile.
        loop = asyncio.get_running_loop()
        outcome = await loop.run_in_executor(self._clearing, run_auction, requests)
        self.metrics.auction_seconds.observe(time.perf_counter() - started)
        try:
            started = time.perf_counter()
            await loop.run_in_executor(self._clearing, self._settle, batch_id, outcome, by_rid)
            self.metrics.settle_seconds.observe(time.perf_counter() - started)
        except Exception as error:
            self.metrics.ledger_errors.labels(operation="settle").inc()
            log.error("settling batch %s failed; its requests fail unserved: %s", batch_id, error)
            failure = Unavailable(
                "the ledger could not settle the batch; nothing was charged",
                headers={"Retry-After": "1"},
            )
            for ticket in tickets:
                await self._release(ticket, "batch could not be settled")
                await ticket.finish(failure)
                # A retry of the rid is admitted afresh (reusing the hold if it is still open)
                # instead of replaying this failure.
                self._forget((ticket.user, ticket.rid))
            return
        self.metrics.batches.inc()
        self.metrics.batch_size.observe(len(tickets))
        self.metrics.revenue.inc(outcome.revenue)
        self.metrics.welfare.inc(int(outcome.welfare))
        ordered = [by_rid[rid] for rid in outcome.order]
        for ticket in ordered:
            await ticket.clear(self._clearance(batch_id, outcome, ticket))
        self.inflight += len(ordered)
        self._dispatch(ordered, outcome)

    def _settle(self, batch_id: str, outcome: AuctionOutcome, by_rid: dict[str, Ticket]) -> None:
        batch = BatchRecord(
            batch_id=batch_id,
            closed_at=self._clock(),
            n=outcome.size,
            revenue_micros=outcome.revenue,
            welfare_micros=int(outcome.welfare),
            tree_nodes=outcome.tree.nodes,
            tree_depth=outcome.tree.depth,
            shared_tokens=outcome.tree.shared_tokens,
            total_tokens=outcome.tree.total_tokens,
        )
        records = [
            RequestRecord(
                rid=rid,
                user=outcome.users[rid],
                position=outcome.positions[rid],
                priority=float(outcome.priority(rid)),
                bid_micros=outcome.bids[rid],
                prompt_tokens=len(by_rid[rid].tokens),
            )
            for rid in outcome.order
        ]
        self.ledger.settle_batch(batch, records, outcome.payments)

    def _clearance(self, batch_id: str, outcome: AuctionOutcome, ticket: Ticket) -> Clearance:
        sequence = self._sequence
        self._sequence += 1
        return Clearance(
            batch_id=batch_id,
            position=outcome.positions[ticket.ledger_rid],
            batch_size=outcome.size,
            priority=float(outcome.priority(ticket.ledger_rid)),
            bid_micros=ticket.bid_micros,
            charge_micros=outcome.payments[ticket.user],
            sequence=sequence,
        )

    # Dispatch

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _dispatch(self, ordered: list[Ticket], outcome: AuctionOutcome) -> None:
        """Hand the batch to the engine in the auction's order; follow each request."""
        requests = []
        now = time.monotonic()
        for ticket in ordered:
            assert ticket.clearance is not None
            ticket.dispatched = now
            self.metrics.dispatch_lag.observe(now - ticket.arrived)
            if ticket.overhead is not None and ticket.batching_wait is not None:
                self.metrics.overhead.observe(ticket.overhead)
                self.timings.append((ticket.overhead, ticket.batching_wait))
            requests.append(
                EngineRequest(
                    rid=ticket.ledger_rid,
                    input_ids=ticket.tokens,
                    sampling_params=ticket.sampling_params,
                    priority=ticket.clearance.sequence,
                    stream=True,
                )
            )
        # Deferral hook: the dispatcher sends each request now or once the rule releases it.
        self.dispatcher.dispatch(
            outcome,
            requests,
            lambda place, generation: self._spawn(self._serve(ordered[place], generation)),
        )

    async def _serve(self, ticket: Ticket, generation: Generation) -> None:
        clearance = ticket.clearance
        assert clearance is not None and ticket.dispatched is not None
        error: ServiceError | None = None
        ttft: float | None = None
        try:
            async with asyncio.timeout(self.settings.engine_timeout_seconds):
                async for chunk in generation.chunks():
                    if ttft is None:
                        ttft = time.monotonic() - ticket.dispatched
                        self.metrics.engine_ttft.observe(ttft)
                        self.dispatcher.first_token(ticket.ledger_rid)  # deferral hook
                    await ticket.push(
                        Chunk(chunk.text, list(chunk.output_ids), dict(chunk.meta_info))
                    )
        except TimeoutError:
            generation.cancel("the auction server's engine deadline passed")
            error = EngineTimedOut(f"the engine did not finish request {ticket.rid!r} in time")
        except EngineTimeout as failure:
            error = EngineTimedOut(f"the engine timed out on request {ticket.rid!r}: {failure}")
        except EngineError as failure:
            error = EngineFailed(f"the engine failed request {ticket.rid!r}: {failure}")
        finally:
            self.dispatcher.ended(ticket.ledger_rid)  # deferral hook
            self.inflight -= 1
            self.pool.capacity_freed()
        if error is None and not ticket.chunks:
            error = EngineFailed(f"the engine returned nothing for request {ticket.rid!r}")
        if error is not None:
            await self._refund(ticket, clearance, error)
        await self._record(ticket, error, ttft)
        await ticket.finish(error)

    async def _refund(self, ticket: Ticket, clearance: Clearance, error: ServiceError) -> None:
        self.metrics.requests.labels(status="failed").inc()
        if clearance.charge_micros == 0:
            return
        try:
            await asyncio.to_thread(
                self.ledger.refund, clearance.batch_id, ticket.user, f"engine: {error.message}"
            )
        except LedgerError as failure:  # already refunded for another request of the batch
            log.info("refund of %s in %s: %s", ticket.user, clearance.batch_id, failure)
        except Exception as failure:
            self.metrics.ledger_errors.labels(operation="refund").inc()
            log.error("refund of %s in %s failed: %s", ticket.user, clearance.batch_id, failure)

    async def _record(self, ticket: Ticket, error: ServiceError | None, ttft: float | None) -> None:
        meta = ticket.chunks[-1].meta_info if ticket.chunks else {}
        if error is None:
            self.metrics.requests.labels(status="served").inc()
            self.metrics.record_cache(
                int(meta.get("prompt_tokens", len(ticket.tokens))),
                int(meta.get("cached_tokens", 0)),
            )
        cached = meta.get("cached_tokens")
        completion = RequestCompletion(
            rid=ticket.ledger_rid,
            status="failed" if error else "served",
            cached_tokens=cached if isinstance(cached, int) else None,
            ttft_ms=None if ttft is None else ttft * 1000,
        )
        assert ticket.clearance is not None
        # One bookkeeping transaction per batch, written when its last request ends: a write
        # per request would cost as much as the hold and the settlement together.
        batch = self._completions[ticket.clearance.batch_id]
        batch.append(completion)
        if len(batch) < ticket.clearance.batch_size:
            return
        del self._completions[ticket.clearance.batch_id]
        try:
            await asyncio.to_thread(self.ledger.complete_requests, batch)
        except Exception as failure:  # bookkeeping only: the money is already settled
            self.metrics.ledger_errors.labels(operation="record").inc()
            log.warning("recording batch %s failed: %s", ticket.clearance.batch_id, failure)


def _deferral_settings(settings: ServerSettings) -> DeferralSettings | None:
    """The deferral rule's settings; None when it is off or cannot apply (ordered mode)."""
    if not settings.deferral or settings.engine_mode != "priority":
        return None
    return DeferralSettings(settings.deferral_tokens, settings.deferral_max_hold_ms / 1000)
