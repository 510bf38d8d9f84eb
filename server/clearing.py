"""Clearing a closed batch: claim its holds, run the auction, settle, price each request.

All of it runs on the ledger writer's thread, and the claim, the auction and the settlement
happen in one ledger transaction (the writer's group commit, `BatchClearing.claim`): a request
whose hold cannot be claimed (settled by another replica under the same rid, released
meanwhile, placed for another payload, or refused in the same commit) leaves the batch before
the auction, so it changes nobody else's schedule or charge and fails nobody else's request.

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

from inference_auctions.billing import (
    BatchClaim,
    BatchRecord,
    ClaimedBatch,
    PricedRequest,
    RequestRecord,
)
from inference_auctions.server.auction import AuctionOutcome, AuctionRequest, run_auction
from inference_auctions.server.auction.repricing import Repricer
from inference_auctions.server.tickets import Ticket


class SpeculationVoid(Exception):
    """A batch cleared ahead of its commit could not be claimed whole: nothing of it was
    settled (its holds stay open), and it must be cleared again from what the ledger holds."""


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


class BatchClearing:
    """One closed batch on its way through the ledger writer: the claim that runs the auction
    under the ledger's locks (`claim`), and the cleared batch made of what it settled
    (`cleared`)."""

    def __init__(
        self, tickets: Sequence[Ticket], batch_id: str, clock: Callable[[], datetime]
    ) -> None:
        self._by_rid = {ticket.ledger_rid: ticket for ticket in tickets}
        self._batch_id = batch_id
        self._clock = clock
        self._made: tuple[AuctionOutcome, Repricer, float] | None = None
        self._speculated = False
        self._result: ClearedBatch | None = None
        self.claim = BatchClaim(
            candidates=[(t.ledger_rid, t.user) for t in tickets],
            clear=self._clear,
            # A hold placed for another payload under the same rid is never claimed for this one.
            fingerprints={t.ledger_rid: t.fingerprint for t in tickets},
        )

    def _clear(
        self, claimable: list[str]
    ) -> tuple[BatchRecord, list[RequestRecord], dict[str, int]]:
        """Run the auction over the claimable requests (on the writer thread, under the locks);
        a batch cleared ahead settles only whole."""
        if self._speculated:
            if len(claimable) != len(self._by_rid):
                raise SpeculationVoid(
                    f"{len(self._by_rid) - len(claimable)} of the batch's holds were not claimable"
                )
        else:
            self._run(claimable)
        assert self._made is not None
        outcome, repricer, _ = self._made
        chosen = [self._by_rid[rid] for rid in claimable]
        return _records(self._batch_id, self._clock(), outcome, repricer, chosen)

    def _run(self, rids: list[str]) -> None:
        started = time.perf_counter()
        chosen = [self._by_rid[rid] for rid in rids]
        requests = [AuctionRequest(t.ledger_rid, t.user, t.tokens, t.bid_micros) for t in chosen]
        outcome = run_auction(requests)
        repricer = Repricer.from_outcome(outcome)
        self._made = (outcome, repricer, time.perf_counter() - started)

    def speculate(self) -> ClearedBatch:
        """Clear the whole batch now, ahead of its commit; the claim then settles it as cleared
        here, or nothing of it (`SpeculationVoid`)."""
        self._speculated = True
        self._run(list(self._by_rid))
        return self._batch()

    def cleared(self, claimed: ClaimedBatch) -> Cleared:
        """The settled batch with every request's share of its user's charge, and the refused."""
        if claimed.settled is None:
            if self._speculated:
                raise SpeculationVoid("none of the batch's holds were claimable")
            return Cleared(batch=None, refused=dict(claimed.refused))
        return Cleared(batch=self._batch(), refused=dict(claimed.refused))

    def _batch(self) -> ClearedBatch:
        if self._result is None:  # once: a speculated batch is the one its claim settles
            assert self._made is not None, "a settled batch was cleared"
            outcome, repricer, seconds = self._made
            shares: dict[str, int] = {}
            for user, charge in outcome.payments.items():
                shares.update(repricer.shares(user, charge, outcome.positions))
            self._result = ClearedBatch(self._batch_id, outcome, repricer, shares, seconds)
        return self._result


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
