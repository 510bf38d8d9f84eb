"""Clearing a closed batch: claim its holds, run the auction, settle, price each request.

All of it runs in the ledger writer (on its thread: `server.ledger_lanes`), and the claim, the
auction and the settlement happen in one ledger transaction (the writer's group commit,
`BatchClearing.claim`): a request whose hold cannot be claimed (settled by another replica under
the same rid, released meanwhile, placed for another payload, or refused in the same commit)
leaves the batch before the auction, so it changes nobody else's schedule or charge and fails
nobody else's request. What the commit runs is a small object of its own (`ClearedAtCommit`,
`ClearedAhead`).

A batch may also be cleared ahead of its commit (`BatchClearing.speculate`, on the event loop):
its requests then go to the engine while the commit runs, and the claim settles exactly that
batch or nothing (`SpeculationVoid`, when any of its holds cannot be claimed), so what is
settled is always what the engine was given.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, cast

from inference_auctions.billing import (
    BatchClaim,
    BatchRecord,
    ClaimedBatch,
    PricedRequest,
    RequestRecord,
)
from inference_auctions.server.auction import AuctionOutcome, AuctionRequest, run_auction
from inference_auctions.server.auction.charges import (
    FIXED_PRICE_RULES,
    PAPER_RULE,
    Mode,
    PricingRule,
    Repricer,
)
from inference_auctions.server.auction.fixed_price import FixedPriceRepricer, clear_fixed_price
from inference_auctions.server.tickets import Ticket


class SpeculationVoid(Exception):
    """A batch cleared ahead of its commit could not be claimed whole: nothing of it was
    settled (its holds stay open), and it must be cleared again from what the ledger holds."""


@dataclass(eq=False)
class ClearedBatch:
    """A settled batch, and what its users' failures so far refund (SPEC section 1)."""

    batch_id: str
    outcome: AuctionOutcome
    repricer: Repricer | FixedPriceRepricer
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
            raise SpeculationVoid(
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
    ) -> None:
        self.batch_id = batch_id
        self.closed_at = closed_at
        self.requests = {request.rid: request for request in requests}
        self.rule = rule
        self.made: _Made | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {**vars(self), "made": None}  # what the other process made stays there

    def __call__(self, claimable: list[str]) -> _Records:
        chosen = [self.requests[rid] for rid in claimable]
        self.made = _auction(chosen, self.rule)
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
    ) -> None:
        self._rule = rule
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
        (`speculate`), or to clear in the commit."""
        clear: ClearedAhead | ClearedAtCommit
        if self._ahead is not None:
            clear = self._ahead[1]
        else:
            if self._at_commit is None:
                self._at_commit = ClearedAtCommit(
                    self._batch_id, self._clock(), self._requests, self._rule
                )
            clear = self._at_commit
        return BatchClaim(self._candidates, clear, self._fingerprints)

    def speculate(self) -> ClearedBatch:
        """Clear the whole batch now, ahead of its commit; the claim then settles it as cleared
        here, or nothing of it (`SpeculationVoid`)."""
        made = _auction(self._requests, self._rule)
        records = _records(self._batch_id, self._clock(), made, self._requests)
        self._ahead = (made, ClearedAhead(records))
        return self._batch(made)

    def cleared(self, claimed: ClaimedBatch) -> Cleared:
        """The settled batch with every request's share of its user's charge, and the refused."""
        if claimed.settled is None:
            if self._ahead is not None:
                raise SpeculationVoid("none of the batch's holds were claimable")
            return Cleared(batch=None, refused=dict(claimed.refused))
        if self._ahead is not None:
            return Cleared(batch=self._batch(self._ahead[0]), refused=dict(claimed.refused))
        assert self._at_commit is not None, "a batch was settled without its claim"
        made = self._at_commit.made
        if made is None:  # cleared in the writer's process: the same auction, run again here
            claimable = [rid for rid in self._rids if rid not in claimed.refused]
            made = _auction([self._at_commit.requests[rid] for rid in claimable], self._rule)
            settled = claimed.settled
            charged, fees = settled.charges_micros, settled.fees_micros
            if any(charged.get(user, 0) != paid for user, paid in made.outcome.payments.items()):
                raise RuntimeError("the auction run again does not charge what was settled")
            if any(fees.get(user, 0) != fee for user, fee in made.outcome.fees.items()):
                raise RuntimeError("the auction run again does not take the fees settled")
        return Cleared(batch=self._batch(made), refused=dict(claimed.refused))

    def _batch(self, made: _Made) -> ClearedBatch:
        if self._result is None:  # once: a speculated batch is the one its claim settles
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
    repricer: Repricer | FixedPriceRepricer
    seconds: float


def _auction(requests: list[AuctionRequest], rule: PricingRule) -> _Made:
    """The batch cleared under the server's mode: the auction, or a fixed price."""
    started = time.perf_counter()
    repricer: Repricer | FixedPriceRepricer
    if rule.fixed_price:
        outcome = clear_fixed_price(requests, rule)
        repricer = FixedPriceRepricer(outcome)
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
    batch = BatchRecord(
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
        RequestRecord(
            rid=request.rid,
            user=request.user,
            position=outcome.positions[request.rid],
            priority=float(outcome.priority(request.rid)),
            bid_micros=request.bid,
            prompt_tokens=len(request.tokens),
            arrival=arrival,
            tree_path=paths[request.rid],
        )
        for arrival, request in enumerate(requests)
    ]
    return batch, records, outcome.payments


# A batch's record, its requests' records and every user's charge: what settles it.
_Records = tuple[BatchRecord, list[RequestRecord], dict[str, int]]


def refund_rule(
    requests: Sequence[PricedRequest], user: str, failed: frozenset[str], charge: int
) -> int:
    """The failure refund (SPEC section 1) of a settled batch, priced again from the tree shape
    the ledger stored with it and under the pricing rule it was cleared with: what crash
    recovery refunds."""
    return settled_repricer(requests).failure_refund(user, failed, charge)


def settled_repricer(requests: Sequence[PricedRequest]) -> Repricer | FixedPriceRepricer:
    """A settled batch, rebuilt from what the ledger stored (tree shape, arrival order, bids)
    under the pricing rule it was cleared with, ready to be priced again."""
    ordered = sorted(requests, key=lambda r: -1 if r.arrival is None else r.arrival)
    rebuilt = [AuctionRequest(r.rid, r.user, r.tree_path or [], r.bid_micros) for r in ordered]
    if ordered and ordered[0].pricing_rule in FIXED_PRICE_RULES:
        # Each request's recorded bid is the price it was admitted at.
        mode = cast(Mode, ordered[0].pricing_rule)
        return FixedPriceRepricer(clear_fixed_price(rebuilt, PricingRule(mode=mode)))
    slots = ordered[0].priority_slots if ordered else None
    return Repricer(rebuilt, PAPER_RULE if slots is None else PricingRule(slots=slots))
