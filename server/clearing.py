"""Clearing a closed batch: claim its holds, run the auction, settle, price each request.

All of it runs on the clearing thread, and the claim, the auction and the settlement happen in
one ledger transaction: a request whose hold cannot be claimed (settled by another replica
under the same rid, released meanwhile) leaves the batch before the auction, so it changes
nobody else's schedule or charge and fails nobody else's request.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from inference_auctions.billing import BatchRecord, Ledger, PricedRequest, RequestRecord
from inference_auctions.server.auction import AuctionOutcome, AuctionRequest, run_auction
from inference_auctions.server.auction.repricing import Repricer
from inference_auctions.server.tickets import Ticket


@dataclass(eq=False)
class ClearedBatch:
    """A settled batch, and what its users' failures so far refund (SPEC section 1)."""

    batch_id: str
    outcome: AuctionOutcome
    repricer: Repricer
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


def clear_and_settle(
    ledger: Ledger, tickets: Sequence[Ticket], batch_id: str, clock: Callable[[], datetime]
) -> Cleared:
    """Claim, clear and settle `tickets` (blocking: run it on the clearing thread)."""
    by_rid = {ticket.ledger_rid: ticket for ticket in tickets}
    made: list[tuple[AuctionOutcome, Repricer, float]] = []

    def clear(claimable: list[str]) -> tuple[BatchRecord, list[RequestRecord], dict[str, int]]:
        started = time.perf_counter()
        chosen = [by_rid[rid] for rid in claimable]
        requests = [AuctionRequest(t.ledger_rid, t.user, t.tokens, t.bid_micros) for t in chosen]
        outcome = run_auction(requests)
        repricer = Repricer.from_outcome(outcome)
        made[:] = [(outcome, repricer, time.perf_counter() - started)]
        return _records(batch_id, clock(), outcome, repricer, chosen)

    claimed = ledger.settle_claimable([(t.ledger_rid, t.user) for t in tickets], clear)
    if claimed.settled is None:
        return Cleared(batch=None, refused=dict(claimed.refused))
    outcome, repricer, seconds = made[0]
    shares: dict[str, int] = {}
    for user, charge in outcome.payments.items():
        shares.update(repricer.shares(user, charge, outcome.positions))
    batch = ClearedBatch(batch_id, outcome, repricer, shares, seconds)
    return Cleared(batch=batch, refused=dict(claimed.refused))


def _records(
    batch_id: str,
    closed_at: datetime,
    outcome: AuctionOutcome,
    repricer: Repricer,
    chosen: list[Ticket],
) -> tuple[BatchRecord, list[RequestRecord], dict[str, int]]:
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
    )
    paths = repricer.tree_paths()
    records = [
        RequestRecord(
            rid=ticket.ledger_rid,
            user=ticket.user,
            position=outcome.positions[ticket.ledger_rid],
            priority=float(outcome.priority(ticket.ledger_rid)),
            bid_micros=ticket.bid_micros,
            prompt_tokens=len(ticket.tokens),
            arrival=arrival,
            tree_path=paths[ticket.ledger_rid],
        )
        for arrival, ticket in enumerate(chosen)
    ]
    return batch, records, outcome.payments


def refund_rule(
    requests: Sequence[PricedRequest], user: str, failed: frozenset[str], charge: int
) -> int:
    """The failure refund (SPEC section 1) of a settled batch, priced again from the tree shape
    the ledger stored with it: what crash recovery refunds."""
    ordered = sorted(requests, key=lambda r: -1 if r.arrival is None else r.arrival)
    repricer = Repricer(
        [AuctionRequest(r.rid, r.user, r.tree_path or [], r.bid_micros) for r in ordered]
    )
    return repricer.failure_refund(user, failed, charge)
