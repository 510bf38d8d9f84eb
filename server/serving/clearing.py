"""What happens to a batch once the pool closes it: cleared, settled, handed to dispatch.

Two ways through, both ending in `BatchDispatch.dispatch`:

* ahead of the commit: when its users can afford their queued bids as of the ledger writer's
  last commit (`LedgerWriter.affords_queued`) and none is distrusted (`Distrust`), the batch is
  cleared here on the event loop and sent to the engine at once, while the writer's next group
  commit claims its holds and settles it (`server.serving.dispatch_ahead`). That commit confirms it
  (the clearances go out) or voids it (the engine lets go of it and it is cleared again, or, if the
  commit itself failed, it fails as below);
* after the commit: its holds are claimed, the auction is run and the batch settled in the
  writer's next group commit (`BatchClearing`), then it is dispatched. A request whose
  hold could not be claimed leaves the batch with its own error; a batch that could not be
  settled fails whole, nothing charged.

Either way the call returns once the commit has told, so that the pool closes the next batch,
as after any settlement, with what arrived meanwhile.

`BatchClearing`: claim a closed batch's holds, run the auction, settle, price each request.

All of it runs in the ledger writer (on its thread: `server.ledger_writer.writer`), and the claim,
the auction and the settlement happen in one ledger transaction (the writer's group commit,
`BatchClearing.claim`): a request whose hold cannot be claimed (settled by another replica under
the same rid, released meanwhile, placed for another payload, or refused in the same commit)
leaves the batch before the auction, so it changes nobody else's schedule or charge and fails
nobody else's request. What the commit runs is a small object of its own (`ClearedAtCommit`,
`ClearedAhead`).

A batch may also be cleared ahead of its commit (`BatchClearing.clear_ahead`, on the event loop):
its requests then go to the engine while the commit runs, and the claim settles exactly that
batch or nothing (`BatchAheadVoid`, when any of its holds cannot be claimed), so what is
settled is always what the engine was given.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, cast

from inference_auctions.billing import (
    BatchClaim,
    BatchInput,
    ClaimedBatch,
    LedgerUnavailable,
    PricedRequestView,
    RequestInput,
)
from inference_auctions.server.auction import AuctionOutcome, AuctionRequest, run_auction
from inference_auctions.server.auction.charges import (
    FIXED_PRICE_RULES,
    PAPER_RULE,
    ROLLING_SLOTS,
    Mode,
    PricingRule,
    Repricer,
)
from inference_auctions.server.auction.fixed_price import FixedPriceRepricer, clear_fixed_price
from inference_auctions.server.auction.rolling import (
    HeadPricing,
    RollingRepricer,
    clear_head,
    settled_rolling_outcome,
)
from inference_auctions.server.errors import Conflict, ServiceError
from inference_auctions.server.ledger_writer.writer import LedgerWriter
from inference_auctions.server.metrics import Metrics
from inference_auctions.server.serving.admission import (
    Admissions,
    conflict,
    hold_was_placed,
    unavailable,
)
from inference_auctions.server.serving.dispatch import BatchDispatch
from inference_auctions.server.serving.dispatch_ahead import BatchAhead, Distrust
from inference_auctions.server.serving.tickets import Clearance, Ticket
from inference_auctions.server.serving.tiers import TierFigures, Waited
from inference_auctions.server.settings import ServerSettings

# What prices a settled batch again, under each rule.
AnyRepricer = Repricer | FixedPriceRepricer | RollingRepricer

__all__ = ["BatchClearing", "BatchClosing", "ClearedBatch", "refund_rule", "settled_repricer"]

log = logging.getLogger(__name__)


class BatchClosing:
    """The pool's callback for a closed batch (see the module docstring). It frees the holds
    of requests it fails, and lets a retry of their rids be admitted afresh (`admissions`)."""

    def __init__(
        self,
        settings: ServerSettings,
        writer: LedgerWriter,
        metrics: Metrics,
        dispatch: BatchDispatch,
        distrust: Distrust,
        *,
        admissions: Admissions,
        new_batch_id: Callable[[], str],
        clock: Callable[[], datetime],
        tier_figures: TierFigures,
        still_waiting: Callable[[], int],
    ) -> None:
        """`still_waiting`: how many requests wait in the pool now (those a batch sent now
        goes ahead of)."""
        self._settings = settings
        self._writer = writer
        self._metrics = metrics
        self._dispatch = dispatch
        self._distrust = distrust
        self._admissions = admissions
        self._new_batch_id = new_batch_id
        self._clock = clock
        self._sequence = 0  # the engine priority of the next request cleared
        self._tiers = settings.tier_menu() if settings.pricing == "tiers" else None
        self._rule = settings.auction_rule()  # every batch of this server is cleared under it
        self._tier_figures = tier_figures
        self._still_waiting = still_waiting
        self._floor = settings.posts_price_floor

    async def __call__(
        self, tickets: list[Ticket], head_pricing: HeadPricing | None = None
    ) -> None:
        """Clear, settle and dispatch a closed batch; return once its commit has told.
        `head_pricing`: a rolling auction's head as its clearing priced it against the pool."""
        closed = time.monotonic()
        for ticket in tickets:
            ticket.closed = closed
        if self._may_dispatch_ahead(tickets, closed):
            clearing = self._clearing(tickets, head_pricing)
            try:
                batch = clearing.clear_ahead()
            except Exception:  # a bug in clearing: the claim below fails the batch cleanly
                log.exception("clearing a batch ahead of its commit failed")
            else:
                await self._dispatch_ahead(clearing, batch, tickets, head_pricing)
                return
        await self._clear_committed(self._clearing(tickets, head_pricing), tickets)

    def _clearing(self, tickets: list[Ticket], head_pricing: HeadPricing | None) -> BatchClearing:
        return BatchClearing(tickets, self._new_batch_id(), self._clock, self._rule, head_pricing)

    def _may_dispatch_ahead(self, tickets: list[Ticket], now: float) -> bool:
        """Whether the batch may go to the engine while its settlement commits: small enough
        to clear on the event loop, and every user in it able to afford their queued bids as
        of the last commit and not recently refused a claim."""
        settings = self._settings
        if not settings.dispatch_ahead or len(tickets) > settings.dispatch_ahead_max_batch:
            return False
        return all(
            self._writer.affords_queued(ticket.user) and self._distrust.trusted(ticket.user, now)
            for ticket in tickets
        )

    async def _dispatch_ahead(
        self,
        clearing: BatchClearing,
        batch: ClearedBatch,
        tickets: list[Ticket],
        head_pricing: HeadPricing | None,
    ) -> None:
        """Send the batch, cleared here, to the engine now; its commit confirms it, or it is
        cleared again (`server.serving.dispatch_ahead`)."""
        by_rid = {ticket.ledger_rid: ticket for ticket in tickets}
        ordered = [by_rid[rid] for rid in batch.outcome.order]
        clearances = [self._clearance(batch, ticket) for ticket in ordered]
        ahead = BatchAhead([ticket.engine_rid for ticket in ordered])
        self._metrics.batches_ahead.inc()
        # Queued in this turn, so that it rides in the same commit as the holds queued in it.
        claimed = self._writer.queue_claim(clearing.claim)
        self._dispatch.dispatch(ordered, clearances, batch, ahead)
        # Counted for the tiers' figures once confirmed, as the pool stood when it was sent.
        waiting = self._still_waiting()
        await self._confirm(
            clearing, claimed, tickets, ordered, clearances, ahead, head_pricing, waiting
        )

    async def _confirm(
        self,
        clearing: BatchClearing,
        claimed: asyncio.Future[ClaimedBatch],
        tickets: list[Ticket],
        ordered: list[Ticket],
        clearances: list[Clearance],
        ahead: BatchAhead,
        head_pricing: HeadPricing | None,
        still_waiting: int,
    ) -> None:
        """Wait for the commit of a batch sent ahead; let its answers go, or clear it again.
        `still_waiting`: the requests in the pool when it was sent."""
        started = time.perf_counter()
        try:
            cleared = clearing.cleared(await claimed)
        except BatchAheadVoid as void:
            self._metrics.batches_voided.inc()
            log.info("a batch sent ahead of its commit is cleared again: %s", void)
            await self._dispatch.void(ahead)
            for ticket in tickets:
                ticket.forget_chunks()
                ticket.resent += 1
            await self._clear_committed(self._clearing(tickets, head_pricing), tickets)
            return
        except Exception as error:
            await self._dispatch.void(ahead)
            await self._fail_unsettled(tickets, error)
            return
        self._metrics.settle_seconds.observe(time.perf_counter() - started)
        assert cleared.batch is not None and not cleared.refused  # whole, or void
        self._count(cleared.batch)
        for ticket, clearance in zip(ordered, clearances, strict=True):
            await ticket.clear(clearance)
        ahead.confirm()
        self._sent(ordered, still_waiting)

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
        self._sent(ordered, self._still_waiting())

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
            await self._admissions.release_when_placed(ticket, "batch could not be settled")
            await ticket.finish(failure)
            # A retry of the rid is admitted afresh (its hold re-opened) instead of
            # replaying this failure.
            self._admissions.forget(ticket)

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
            self._admissions.forget(ticket)
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
                    self._metrics.tier_requests.labels(tier=tier.name).inc()
                    self._metrics.tier_revenue.labels(tier=tier.name).inc(tier.price_micros)

    def _sent(self, ordered: list[Ticket], still_waiting: int) -> None:
        """Under `tiers`, count a batch sent to the engine, in its order, for the figures each
        tier publishes (`server.serving.tiers`); batches are sent one at a time, each once
        the one before it was, so their dispatch times come in order."""
        if self._tiers is None or not ordered:
            return
        tiers = self._tiers
        at = ordered[0].dispatched
        head = []
        for ticket in ordered:
            tier = tiers.by_price(ticket.bid_micros)
            joined = ticket.arrived if ticket.queued is None else ticket.queued
            head.append(Waited(None if tier is None else tier.name, ticket.arrived, joined))
        self._tier_figures.sent(head, time.monotonic() if at is None else at, still_waiting)

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
            floor_micros=outcome.floors.get(ticket.ledger_rid, 0) if self._floor else None,
        )


class BatchAheadVoid(Exception):
    """A batch cleared ahead of its commit could not be claimed whole: nothing of it was
    settled (its holds stay open), and it must be cleared again from what the ledger holds."""


@dataclass(eq=False)
class ClearedBatch:
    """A settled batch, and what its users' failures so far refund (SPEC section 1)."""

    batch_id: str
    outcome: AuctionOutcome
    repricer: AnyRepricer
    shares: dict[str, int]  # ledger rid -> the request's share of its user's charge
    auction_seconds: float
    failed: dict[str, set[str]] = field(default_factory=dict)  # user -> ledger rids

    def charge(self, user: str) -> int:
        """The user's charge for the batch."""
        return self.outcome.payments.get(user, 0)

    def refund_after_failure(self, user: str, rid: str) -> int:
        """The user's refund once `rid` failed too: for every failed request so far."""
        failed = self.failed.setdefault(user, set())
        failed.add(rid)
        return self.repricer.failure_refund(user, failed, self.charge(user))


@dataclass(frozen=True, slots=True)
class Cleared:
    """The batch settled for the claimable requests (None if none), and the refused ones."""

    batch: ClearedBatch | None
    refused: dict[str, str]  # ledger rid -> its hold's state


class ClearedAhead:
    """The clearing of a batch cleared ahead of its commit: its records, made on the event loop,
    settled whole or not at all."""

    def __init__(self, records: _Records) -> None:
        self.records = records

    def __call__(self, claimable: list[str]) -> _Records:
        _, requests, _ = self.records
        if len(claimable) != len(requests):
            raise BatchAheadVoid(
                f"{len(requests) - len(claimable)} of the batch's holds were not claimable"
            )
        return self.records


class ClearedAtCommit:
    """The clearing of a batch cleared in its commit: the auction over the requests whose holds
    the commit claimed, under the ledger's locks. It also keeps what it made (`made`), so that
    the event loop does not run the same auction again."""

    def __init__(
        self,
        batch_id: str,
        closed_at: datetime,
        requests: Sequence[AuctionRequest],
        rule: PricingRule = PAPER_RULE,
        head_pricing: HeadPricing | None = None,
    ) -> None:
        self.batch_id = batch_id
        self.closed_at = closed_at
        self.requests = {request.rid: request for request in requests}
        self.rule = rule
        self.head_pricing = head_pricing
        self.made: _Made | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {**vars(self), "made": None}  # what the other process made stays there

    def __call__(self, claimable: list[str]) -> _Records:
        chosen = [self.requests[rid] for rid in claimable]
        self.made = _auction(chosen, self.rule, self.head_pricing)
        return _records(self.batch_id, self.closed_at, self.made, chosen)


class BatchClearing:
    """One closed batch on its way through the ledger writer: the claim that runs the auction
    under the ledger's locks (`claim`), and the cleared batch made of what it settled
    (`cleared`)."""

    def __init__(
        self,
        tickets: Sequence[Ticket],
        batch_id: str,
        clock: Callable[[], datetime],
        rule: PricingRule = PAPER_RULE,
        head_pricing: HeadPricing | None = None,
    ) -> None:
        self._rule = rule
        self._head_pricing = head_pricing
        self._rids = [ticket.ledger_rid for ticket in tickets]
        self._batch_id = batch_id
        self._clock = clock
        self._candidates = [(t.ledger_rid, t.user) for t in tickets]
        # A hold placed for another payload under the same rid is never claimed for this one.
        self._fingerprints = {t.ledger_rid: t.fingerprint for t in tickets}
        self._requests = [
            AuctionRequest(t.ledger_rid, t.user, t.tokens, t.bid_micros) for t in tickets
        ]
        self._ahead: tuple[_Made, ClearedAhead] | None = None
        self._at_commit: ClearedAtCommit | None = None
        self._result: ClearedBatch | None = None

    @property
    def claim(self) -> BatchClaim:
        """The claim for the writer's next group commit: the batch as cleared ahead
        (`clear_ahead`), or to clear in the commit."""
        clear: ClearedAhead | ClearedAtCommit
        if self._ahead is not None:
            clear = self._ahead[1]
        else:
            if self._at_commit is None:
                self._at_commit = ClearedAtCommit(
                    self._batch_id, self._clock(), self._requests, self._rule, self._head_pricing
                )
            clear = self._at_commit
        return BatchClaim(self._candidates, clear, self._fingerprints)

    def clear_ahead(self) -> ClearedBatch:
        """Clear the whole batch now, ahead of its commit; the claim then settles it as cleared
        here, or nothing of it (`BatchAheadVoid`)."""
        made = _auction(self._requests, self._rule, self._head_pricing)
        records = _records(self._batch_id, self._clock(), made, self._requests)
        self._ahead = (made, ClearedAhead(records))
        return self._batch(made)

    def cleared(self, claimed: ClaimedBatch) -> Cleared:
        """The settled batch with every request's share of its user's charge, and the refused."""
        if claimed.settled is None:
            if self._ahead is not None:
                raise BatchAheadVoid("none of the batch's holds were claimable")
            return Cleared(batch=None, refused=dict(claimed.refused))
        if self._ahead is not None:
            return Cleared(batch=self._batch(self._ahead[0]), refused=dict(claimed.refused))
        assert self._at_commit is not None, "a batch was settled without its claim"
        made = self._at_commit.made
        if made is None:  # cleared in the writer's process: the same auction, run again here
            claimable = [rid for rid in self._rids if rid not in claimed.refused]
            made = _auction(
                [self._at_commit.requests[rid] for rid in claimable], self._rule, self._head_pricing
            )
            settled = claimed.settled
            charged, fees = settled.charges_micros, settled.fees_micros
            floors: dict[str, int] = {}
            for rid, part in made.outcome.floors.items():
                floors[made.outcome.users[rid]] = floors.get(made.outcome.users[rid], 0) + part
            if floors != dict(settled.floors_micros):
                raise RuntimeError("the auction run again does not take the floors settled")
            if any(charged.get(user, 0) != paid for user, paid in made.outcome.payments.items()):
                raise RuntimeError("the auction run again does not charge what was settled")
            if any(fees.get(user, 0) != fee for user, fee in made.outcome.fees.items()):
                raise RuntimeError("the auction run again does not take the fees settled")
        return Cleared(batch=self._batch(made), refused=dict(claimed.refused))

    def _batch(self, made: _Made) -> ClearedBatch:
        if self._result is None:  # once: a batch cleared ahead is the one its claim settles
            shares: dict[str, int] = {}
            for user, charge in made.outcome.payments.items():
                shares.update(made.repricer.shares(user, charge, made.outcome.positions))
            self._result = ClearedBatch(
                self._batch_id, made.outcome, made.repricer, shares, made.seconds
            )
        return self._result


@dataclass(frozen=True, slots=True)
class _Made:
    """An auction's outcome, its repricer and the seconds both took."""

    outcome: AuctionOutcome
    repricer: AnyRepricer
    seconds: float


def _auction(
    requests: list[AuctionRequest], rule: PricingRule, head_pricing: HeadPricing | None = None
) -> _Made:
    """The batch cleared under the server's mode: the auction (the head of a rolling pool,
    as `head_pricing` priced it), or a fixed price."""
    started = time.perf_counter()
    repricer: AnyRepricer
    if rule.fixed_price:
        outcome = clear_fixed_price(requests, rule)
        repricer = FixedPriceRepricer(outcome)
    elif rule.rolling:
        if head_pricing is None:
            raise RuntimeError("a rolling auction's head was cleared without its pricing")
        outcome = clear_head(requests, head_pricing, rule)
        repricer = RollingRepricer(outcome)
    else:
        outcome = run_auction(requests, rule)
        repricer = Repricer.from_outcome(outcome)
    return _Made(outcome, repricer, time.perf_counter() - started)


def _records(
    batch_id: str, closed_at: datetime, made: _Made, requests: list[AuctionRequest]
) -> _Records:
    """What settles the batch: its record, one per request (`requests`, in the order the batch
    closed with) and every user's charge."""
    outcome, repricer = made.outcome, made.repricer
    batch = BatchInput(
        batch_id=batch_id,
        closed_at=closed_at,
        n=outcome.size,
        revenue_micros=outcome.revenue,
        welfare_micros=int(outcome.welfare),
        tree_nodes=outcome.tree.nodes,
        tree_depth=outcome.tree.depth,
        shared_tokens=outcome.tree.shared_tokens,
        total_tokens=outcome.tree.total_tokens,
        pricing_rule=outcome.rule.name,
        priority_slots=outcome.rule.slots,
        request_fee_micros=outcome.rule.request_fee_micros,
    )
    paths = repricer.tree_paths()
    records = [
        RequestInput(
            rid=request.rid,
            user=request.user,
            position=outcome.positions[request.rid],
            priority=float(outcome.priority(request.rid)),
            bid_micros=request.bid,
            prompt_tokens=len(request.tokens),
            arrival=arrival,
            tree_path=paths[request.rid],
            floor_micros=outcome.floors.get(request.rid, 0),
        )
        for arrival, request in enumerate(requests)
    ]
    return batch, records, outcome.payments


# A batch's record, its requests' records and every user's charge: what settles it.
_Records = tuple[BatchInput, list[RequestInput], dict[str, int]]


def refund_rule(
    requests: Sequence[PricedRequestView], user: str, failed: frozenset[str], charge: int
) -> int:
    """The failure refund (SPEC section 1) of a settled batch, priced again from the tree shape
    the ledger stored with it and under the pricing rule it was cleared with: what crash
    recovery refunds."""
    return settled_repricer(requests).failure_refund(user, failed, charge)


def settled_repricer(requests: Sequence[PricedRequestView]) -> AnyRepricer:
    """A settled batch, rebuilt from what the ledger stored (tree shape, arrival order, bids,
    positions) under the pricing rule it was cleared with, ready to be priced again."""
    ordered = sorted(requests, key=lambda r: -1 if r.arrival is None else r.arrival)
    rebuilt = [AuctionRequest(r.rid, r.user, r.tree_path or [], r.bid_micros) for r in ordered]
    if ordered and ordered[0].pricing_rule == ROLLING_SLOTS:
        # Refunds and shares read each request's bid and position only.
        return RollingRepricer(settled_rolling_outcome(rebuilt, [r.position for r in ordered]))
    if ordered and ordered[0].pricing_rule in FIXED_PRICE_RULES:
        # Each request's recorded bid is the price it was admitted at.
        mode = cast(Mode, ordered[0].pricing_rule)
        return FixedPriceRepricer(clear_fixed_price(rebuilt, PricingRule(mode=mode)))
    slots = ordered[0].priority_slots if ordered else None
    return Repricer(rebuilt, PAPER_RULE if slots is None else PricingRule(slots=slots))
