"""What happens to a batch once the pool closes it: cleared, settled, and handed to dispatch.

Two ways through, both ending in `BatchDispatch.dispatch`:

* ahead of the commit: when its users can afford their queued bids as of the ledger writer's
  last commit (`LedgerWriter.covers`) and none is distrusted (`server.serving.distrust`), the batch
  is cleared here on the event loop and sent to the engine at once, while the writer's next group
  commit claims its holds and settles it (`server.serving.dispatch_ahead`). That commit confirms it
  (the clearances go out) or voids it (the engine lets go of it and it is cleared again, or, if the
  commit itself failed, it fails as below);
* after the commit: its holds are claimed, the auction is run and the batch settled in the
  writer's next group commit (`server.serving.clearing`), then it is dispatched. A request whose
  hold could not be claimed leaves the batch with its own error; a batch that could not be
  settled fails whole, nothing charged.

Either way the call returns once the commit has told, so that the pool closes the next batch,
as after any settlement, with what arrived meanwhile.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from datetime import datetime

from inference_auctions.billing import ClaimedBatch, LedgerUnavailable
from inference_auctions.server.errors import Conflict, ServiceError
from inference_auctions.server.ledger_writer.writer import LedgerWriter
from inference_auctions.server.metrics import Metrics
from inference_auctions.server.serving.admission import conflict, hold_was_placed, unavailable
from inference_auctions.server.serving.batch_dispatch import BatchDispatch
from inference_auctions.server.serving.clearing import BatchClearing, ClearedBatch, SpeculationVoid
from inference_auctions.server.serving.dispatch_ahead import Speculation
from inference_auctions.server.serving.distrust import Distrust
from inference_auctions.server.serving.tickets import Clearance, Ticket
from inference_auctions.server.serving.tier_figures import TierFigures
from inference_auctions.server.settings import ServerSettings

__all__ = ["BatchClosing"]

log = logging.getLogger(__name__)


class BatchClosing:
    """The pool's callback for a closed batch (see the module docstring). Admission lends it
    two things: `release`, which frees a ticket's hold once its commit is known, and `forget`,
    which lets a retry of the ticket's rid be admitted afresh."""

    def __init__(
        self,
        settings: ServerSettings,
        writer: LedgerWriter,
        metrics: Metrics,
        dispatch: BatchDispatch,
        distrust: Distrust,
        *,
        release: Callable[[Ticket, str], Awaitable[None]],
        forget: Callable[[Ticket], None],
        new_batch_id: Callable[[], str],
        clock: Callable[[], datetime],
        tier_figures: TierFigures,
    ) -> None:
        self._settings = settings
        self._writer = writer
        self._metrics = metrics
        self._dispatch = dispatch
        self._distrust = distrust
        self._release = release
        self._forget = forget
        self._new_batch_id = new_batch_id
        self._clock = clock
        self._sequence = 0  # the engine priority of the next request cleared
        self._tiers = settings.tier_menu() if settings.pricing == "tiers" else None
        self._tier_figures = tier_figures

    async def __call__(self, tickets: list[Ticket]) -> None:
        """Clear, settle and dispatch a closed batch; return once its commit has told."""
        closed = time.monotonic()
        for ticket in tickets:
            ticket.closed = closed
        if self._may_dispatch_ahead(tickets, closed):
            clearing = self._clearing(tickets)
            try:
                batch = clearing.speculate()
            except Exception:  # a bug in clearing: the claim below fails the batch cleanly
                log.exception("clearing a batch ahead of its commit failed")
            else:
                await self._dispatch_ahead(clearing, batch, tickets)
                return
        await self._clear_committed(self._clearing(tickets), tickets)

    def _clearing(self, tickets: list[Ticket]) -> BatchClearing:
        return BatchClearing(
            tickets, self._new_batch_id(), self._clock, self._settings.auction_rule()
        )

    def _may_dispatch_ahead(self, tickets: list[Ticket], now: float) -> bool:
        """Whether the batch may go to the engine while its settlement commits: small enough
        to clear on the event loop, and every user in it able to afford their queued bids as
        of the last commit and not recently refused a claim."""
        settings = self._settings
        if not settings.dispatch_ahead or len(tickets) > settings.dispatch_ahead_max_batch:
            return False
        return all(
            self._writer.covers(ticket.user) and self._distrust.trusted(ticket.user, now)
            for ticket in tickets
        )

    async def _dispatch_ahead(
        self, clearing: BatchClearing, batch: ClearedBatch, tickets: list[Ticket]
    ) -> None:
        """Send the batch, cleared here, to the engine now; its commit confirms it, or it is
        cleared again (`server.serving.dispatch_ahead`)."""
        by_rid = {ticket.ledger_rid: ticket for ticket in tickets}
        ordered = [by_rid[rid] for rid in batch.outcome.order]
        clearances = [self._clearance(batch, ticket) for ticket in ordered]
        speculation = Speculation([ticket.engine_rid for ticket in ordered])
        self._metrics.batches_ahead.inc()
        # Queued in this turn, so that it rides in the same commit as the holds queued in it.
        claimed = self._writer.queue_claim(clearing.claim)
        self._dispatch.dispatch(ordered, clearances, batch, speculation)
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
            self._metrics.batches_voided.inc()
            log.info("a batch sent ahead of its commit is cleared again: %s", void)
            await self._dispatch.void(speculation)
            for ticket in tickets:
                ticket.forget_chunks()
                ticket.resent += 1
            await self._clear_committed(self._clearing(tickets), tickets)
            return
        except Exception as error:
            await self._dispatch.void(speculation)
            await self._fail_unsettled(tickets, error)
            return
        self._metrics.settle_seconds.observe(time.perf_counter() - started)
        assert cleared.batch is not None and not cleared.refused  # whole, or void
        self._count(cleared.batch)
        for ticket, clearance in zip(ordered, clearances, strict=True):
            await ticket.clear(clearance)
        speculation.confirm()

    async def _clear_committed(self, clearing: BatchClearing, tickets: list[Ticket]) -> None:
        """Claim, clear and settle the batch in the writer's next commit, then dispatch it."""
        started = time.perf_counter()
        try:
            # In the writer's next group commit, after the holds queued before it: large
            # batches take tens of milliseconds there, while the event loop keeps serving.
            cleared = clearing.cleared(await self._writer.claim(clearing.claim))
        except Exception as error:
            await self._fail_unsettled(tickets, error)
            return
        self._metrics.settle_seconds.observe(time.perf_counter() - started)
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
        self._dispatch.dispatch(ordered, clearances, batch)

    async def _fail_unsettled(self, tickets: list[Ticket], error: Exception) -> None:
        """The batch could not be settled: its requests fail, nothing charged."""
        self._metrics.ledger_errors.labels(operation="settle").inc()
        # The database away (or a connection it closed mid-commit) is an operational event
        # the clients are told to retry; anything else is a bug.
        level = logging.WARNING if isinstance(error, LedgerUnavailable) else logging.ERROR
        log.log(level, "settling a batch failed; its requests fail unserved: %s", error)
        failure = unavailable("the ledger could not settle the batch; nothing was charged")
        for ticket in tickets:
            if ticket.done:  # its own hold was refused: admission answered it
                continue
            await self._release(ticket, "batch could not be settled")
            await ticket.finish(failure)
            # A retry of the rid is admitted afresh (its hold re-opened) instead of
            # replaying this failure.
            self._forget(ticket)

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
            self._forget(ticket)
        log.info("request %r left its batch: hold %s", ticket.rid, state)
        self._distrust.add(ticket.user)
        await ticket.finish(error)

    def _count(self, batch: ClearedBatch) -> None:
        outcome = batch.outcome
        self._metrics.auction_seconds.observe(batch.auction_seconds)
        self._metrics.batches.inc()
        self._metrics.batch_size.observe(outcome.size)
        self._metrics.revenue.inc(outcome.revenue)
        if outcome.fee_revenue:
            self._metrics.fee_revenue.inc(outcome.fee_revenue)
        self._metrics.welfare.inc(int(outcome.welfare))
        if self._tiers is not None:
            for rid in outcome.order:
                tier = self._tiers.by_price(outcome.bids[rid])
                if tier is not None:
                    self._tier_figures.observe(tier.name, outcome.priority(rid))
                    self._metrics.tier_requests.labels(tier=tier.name).inc()
                    self._metrics.tier_revenue.labels(tier=tier.name).inc(tier.price_micros)

    def _clearance(self, batch: ClearedBatch, ticket: Ticket) -> Clearance:
        sequence = self._sequence
        self._sequence += 1
        outcome = batch.outcome
        tier = None if self._tiers is None else self._tiers.by_price(ticket.bid_micros)
        if tier is not None:
            # Tier by tier at the engine too, first come first served within one.
            sequence = tier.engine_priority
        return Clearance(
            pricing=self._settings.pricing,
            service_tier=None if tier is None else tier.name,
            batch_id=batch.batch_id,
            position=outcome.positions[ticket.ledger_rid],
            batch_size=outcome.size,
            priority=float(outcome.priority(ticket.ledger_rid)),
            bid_micros=ticket.bid_micros,
            user_batch_charge_micros=batch.charge(ticket.user),
            request_charge_micros=batch.shares[ticket.ledger_rid],
            sequence=sequence,
            request_fee_micros=outcome.rule.request_fee_micros,
        )
