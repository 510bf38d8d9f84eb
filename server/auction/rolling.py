"""The rolling auction: the whole waiting pool ordered at every engine opening, its head sent,
each user charged once, at dispatch, for the delay its dispatched requests impose on the pool
(docs/SPEC.md, section 7).

* `PoolOrder`: the pool's positive bids, ordered by the average-bid DFS of their radix tree
  (`schedule`), with what the charges read (`PaymentContext`), built from scratch: the
  reference for the tree the server keeps as requests come and go (`pool_tree`).
* `rolling_charges`: user u's dispatched requests D_u are charged the VCG externality they
  impose on every other request of the pool, in fixed priority slots: with Phi = sum over
  requests of bid x (requests served after it), (K-1) p_u = max Phi(.; b with D_u at 0) -
  Phi(chosen; b with D_u at 0), the same exact numerator as section 1's, over the pool's tree.
  The charge is `min(floor(p_u), sum of D_u's bids)`: a bid is what being served K-1 slots
  sooner is worth, so a request that jumps a deep backlog never pays more than its bid.
* `clear_head`: the dispatched head as a ledger batch: the pool's order restricted to it (a DFS
  order of the head's own tree), its charges as its clearing priced them (`HeadPricing`), its
  fees.
* `RollingRepricer`: a user's charge split over the user's dispatched requests in proportion to
  their bids, and a failed request refunded its share: computed from what the ledger stores
  with every request (bid, position), so crash recovery refunds exactly what the server would.

Pure functions of their input: no I/O, no clock. Money is whole micro-credits.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from inference_auctions.server.auction.batch import (
    AuctionRequest,
    RadixTree,
    TokenArray,
    build_radix_tree,
    validate_batch,
)
from inference_auctions.server.auction.charges import (
    AuctionOutcome,
    PaymentContext,
    PricingRule,
    largest_remainder,
    node_paths,
)
from inference_auctions.server.auction.schedule import average_bid_dfs

__all__ = [
    "HeadPricing",
    "PoolOrder",
    "RollingRepricer",
    "clear_head",
    "order_pool",
    "rolling_charges",
    "rolling_share_refund",
    "settled_rolling_outcome",
]


@dataclass(frozen=True, slots=True)
class PoolOrder:
    """The waiting pool's positive bids (`requests`, in arrival order) and their average-bid
    DFS (`order`: request indexes, first served first)."""

    requests: list[AuctionRequest]
    order: list[int]
    pricing: PaymentContext | None  # None for fewer than two requests: nobody delays anybody

    @property
    def bids(self) -> list[int]:
        return [request.bid for request in self.requests]


def order_pool(requests: Sequence[AuctionRequest]) -> PoolOrder:
    """Order the pool's positive bids by the average-bid DFS (SPEC section 1's schedule)."""
    pool = list(requests)
    if any(request.bid <= 0 for request in pool):
        raise ValueError("only positive bids enter the auction's pool")
    if len(pool) < 2:
        return PoolOrder(pool, list(range(len(pool))), None)
    tree = build_radix_tree([_array(request.tokens) for request in pool])
    schedule = average_bid_dfs(tree, [request.bid for request in pool])
    return PoolOrder(pool, schedule.order, PaymentContext(tree, schedule))


def _array(tokens: Sequence[int] | TokenArray) -> TokenArray:
    """The prompt as an array (the server's tokens already are one: no copy)."""
    return tokens if isinstance(tokens, np.ndarray) else np.asarray(tokens, dtype=np.int64)


def rolling_charges(pool: PoolOrder, dispatched: Collection[int], slots: int) -> dict[str, int]:
    """Every dispatching user's charge: the externality of its dispatched requests (indexes
    into `pool.requests`) on the whole pool, in `slots` priority slots, capped at their bids."""
    by_user: dict[str, list[int]] = {}
    for index in sorted(dispatched):
        by_user.setdefault(pool.requests[index].user, []).append(index)
    denominator = max(slots - 1, 1)
    bids = pool.bids
    charges: dict[str, int] = {}
    for user, mine in by_user.items():
        cap = sum(bids[index] for index in mine)
        if pool.pricing is None:
            charges[user] = 0
            continue
        numerator = pool.pricing.user_numerator(mine, bids)
        charges[user] = min(numerator // denominator, cap)
    return charges


@dataclass(frozen=True, slots=True)
class HeadPricing:
    """A head as its clearing priced it: its bidding requests in the pool's order, their users
    and bids, and each user's charge for all of them (`rolling_charges`)."""

    order: list[str]
    users: dict[str, str]
    bids: dict[str, int]
    charges: dict[str, int]
    # Under a posted price floor, what each request pays of it, besides its user's charge
    # (`server.auction.price_floor`); a request that leaves the head takes its part with it.
    floors: dict[str, int] = field(default_factory=dict)

    def charges_for(self, kept: Collection[str]) -> dict[str, int]:
        """Each user's charge when only `kept` of the head settle: a request that leaves the
        head (its hold could not be claimed) takes its share of its user's charge with it."""
        positions = {rid: place for place, rid in enumerate(self.order)}
        charges: dict[str, int] = {}
        for user, charge in self.charges.items():
            mine = {rid: self.bids[rid] for rid in self.order if self.users[rid] == user}
            left = [rid for rid in mine if rid not in kept]
            if len(left) == len(mine):
                continue
            charges[user] = charge - rolling_share_refund(mine, positions, left, charge)
        return charges


def clear_head(
    head: Sequence[AuctionRequest], pricing: HeadPricing, rule: PricingRule
) -> AuctionOutcome:
    """The dispatched head as a cleared batch: the pool's order restricted to it (its free
    requests, not in the pool, after the bidders in arrival order), each user's rolling charge
    as its clearing priced it, the floor part of each entrant (under a posted floor), and the
    rule's fee for every request."""
    batch = validate_batch(head, rule.slots)
    if not batch.rids:
        return AuctionOutcome(order=[], payments={}, rule=rule)
    present = set(batch.rids)
    bidders = [rid for rid in pricing.order if rid in present]
    free = [rid for rid in batch.rids if rid not in pricing.users]
    order = bidders + free
    charges = pricing.charges_for(present)
    payments = {user: charges.get(user, 0) for user in batch.users}
    fees = dict.fromkeys(batch.users, 0)
    for user in batch.users:
        fees[user] += rule.request_fee_micros
    tree = build_radix_tree(batch.prompts)
    return AuctionOutcome(
        order=order,
        payments=payments,
        rule=rule,
        fees=fees,
        positions={rid: position for position, rid in enumerate(order)},
        floors={rid: part for rid, part in pricing.floors.items() if rid in present and part},
        bids=dict(zip(batch.rids, batch.bids, strict=True)),
        users=dict(zip(batch.rids, batch.users, strict=True)),
        tree=tree.stats,
        radix_tree=tree,
        arrival_order=batch.rids,
    )


def rolling_share_refund(
    bids: Mapping[str, int], positions: Mapping[str, int], failed: Collection[str], charge: int
) -> int:
    """What a user gets back when `failed` of its requests in a rolling batch were not served:
    their shares of its charge (`RollingRepricer.shares`), never more than the charge."""
    shares = _bid_shares(charge, bids, positions)
    return min(sum(shares[rid] for rid in failed if rid in shares), charge)


def _bid_shares(
    charge: int, bids: Mapping[str, int], positions: Mapping[str, int]
) -> dict[str, int]:
    """The charge split in proportion to the bids (equally when all are 0), largest remainder."""
    if not bids:
        return {}
    weights = dict(bids) if any(bids.values()) else dict.fromkeys(bids, 1)
    return largest_remainder(charge, weights, positions)


def settled_rolling_outcome(
    requests: Sequence[AuctionRequest], positions: Sequence[int | None]
) -> AuctionOutcome:
    """A settled rolling batch as far as its refunds and shares read it: each request's user,
    bid and position, as the ledger stored them (`requests` in arrival order)."""
    rids = [request.rid for request in requests]
    known = {rid: place for rid, place in zip(rids, positions, strict=True) if place is not None}
    # A request with no recorded position goes after the others, in arrival order.
    order = sorted(rids, key=lambda rid: (known.get(rid, len(rids)), rids.index(rid)))
    return AuctionOutcome(
        order=order,
        payments={},
        positions={rid: place for place, rid in enumerate(order)},
        bids={request.rid: request.bid for request in requests},
        users={request.rid: request.user for request in requests},
        arrival_order=rids,
    )


class RollingRepricer:
    """The questions a settled rolling batch is asked again (refunds, shares, the tree's shape),
    answered from what the ledger stores with each request: its user, bid and position."""

    def __init__(self, outcome: AuctionOutcome) -> None:
        self._rids = outcome.arrival_order
        self._bids = outcome.bids
        self._users = outcome.users
        self._positions = outcome.positions
        self._tree: RadixTree | None = outcome.radix_tree

    def requests_of(self, user: str) -> list[str]:
        """The user's request ids, in arrival order."""
        return [rid for rid in self._rids if self._users[rid] == user]

    def failure_refund(self, user: str, failed: Collection[str], charge: int) -> int:
        """The failed requests' shares of the user's charge."""
        mine = {rid: self._bids[rid] for rid in self.requests_of(user)}
        return rolling_share_refund(mine, self._positions, failed, charge)

    def shares(self, user: str, charge: int, positions: Mapping[str, int]) -> dict[str, int]:
        """The user's charge split over its requests in proportion to their bids."""
        return _bid_shares(
            charge, {rid: self._bids[rid] for rid in self.requests_of(user)}, positions
        )

    def tree_paths(self) -> dict[str, list[int]]:
        """Each request's path of node ids from the root (the ledger stores them)."""
        if self._tree is None:
            return {rid: [] for rid in self._rids}
        return dict(zip(self._rids, node_paths(self._tree, len(self._rids)), strict=True))
