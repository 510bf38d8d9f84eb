"""Clearing a batch of the fixed-price modes (`tiers`, `fcfs`): no auction, no VCG.

Each request was admitted at a fixed price, its `bid` here: its tier's price under `tiers`, 0
under `fcfs`. The order is by that price, dearest first (a dearer tier first), then by arrival
(first come, first served within a tier, and for the whole batch under `fcfs`); each user pays
the sum of its requests' prices. A failed request refunds exactly its own price (never more
than what is left of its user's charge): under a fixed price, what a request added to its
user's charge is its price. Pure, like the auction: no I/O, no clock.

The radix tree is still built, for the batch's statistics and the prefix deferral, which keeps
requests that share a prefix from computing it twice whatever the order.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

from inference_auctions.server.auction.batch import (
    AuctionRequest,
    RadixTree,
    build_radix_tree,
    validate_batch,
)
from inference_auctions.server.auction.charges import (
    AuctionOutcome,
    PricingRule,
    largest_remainder,
    node_paths,
)

__all__ = ["FixedPriceRepricer", "clear_fixed_price", "fixed_price_refund"]


def clear_fixed_price(requests: Sequence[AuctionRequest], rule: PricingRule) -> AuctionOutcome:
    """The batch in price order (dearest first, then arrival), each user charged its prices."""
    if not rule.fixed_price:
        raise ValueError(f"the {rule.name} rule is an auction's: clear it with run_auction")
    batch = validate_batch(requests)
    if not batch.rids:
        return AuctionOutcome(order=[], payments={}, rule=rule)
    order_index = sorted(range(len(batch.rids)), key=lambda index: (-batch.bids[index], index))
    order = [batch.rids[index] for index in order_index]
    payments = dict.fromkeys(batch.users, 0)
    for user, price in zip(batch.users, batch.bids, strict=True):
        payments[user] += price
    tree = build_radix_tree(batch.prompts)
    return AuctionOutcome(
        order=order,
        payments=payments,
        rule=rule,
        fees=dict.fromkeys(batch.users, 0),
        positions={rid: place for place, rid in enumerate(order)},
        bids=dict(zip(batch.rids, batch.bids, strict=True)),
        users=dict(zip(batch.rids, batch.users, strict=True)),
        tree=tree.stats,
        radix_tree=tree,
        arrival_order=batch.rids,
    )


def fixed_price_refund(prices: Mapping[str, int], failed: Collection[str], charge: int) -> int:
    """What a user gets back when its requests `failed` were not served: their prices, at most
    the user's charge."""
    return min(sum(prices[rid] for rid in failed), charge)


class FixedPriceRepricer:
    """The questions a settled batch is asked again (refunds, shares, the tree's shape), for a
    batch `clear_fixed_price` cleared."""

    def __init__(self, outcome: AuctionOutcome) -> None:
        self._rids = outcome.arrival_order
        self._prices = outcome.bids
        self._users = outcome.users
        self._tree: RadixTree | None = outcome.radix_tree

    def requests_of(self, user: str) -> list[str]:
        """The user's request ids, in arrival order."""
        return [rid for rid in self._rids if self._users[rid] == user]

    def failure_refund(self, user: str, failed: Collection[str], charge: int) -> int:
        """What the user gets back when `failed` (the user's requests) were not served."""
        return fixed_price_refund(self._prices, failed, charge)

    def shares(self, user: str, charge: int, positions: Mapping[str, int]) -> dict[str, int]:
        """Each of the user's requests carries its own price (they sum to the charge)."""
        rids = self.requests_of(user)
        if charge == sum(self._prices[rid] for rid in rids):
            return {rid: self._prices[rid] for rid in rids}
        if charge == 0 or not any(self._prices[rid] for rid in rids):
            return dict.fromkeys(rids, 0) if charge == 0 else {rids[0]: charge}
        weights = {rid: self._prices[rid] for rid in rids}
        return largest_remainder(charge, weights, positions)

    def tree_paths(self) -> dict[str, list[int]]:
        """Each request's path of node ids from the root (the ledger stores them)."""
        if self._tree is None:
            return {rid: [] for rid in self._rids}
        return dict(zip(self._rids, node_paths(self._tree, len(self._rids)), strict=True))
