"""`run_auction`: clear one batch. Pure: no I/O, no clock, no randomness."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from fractions import Fraction

from inference_auctions.server.auction.payments import PaymentContext
from inference_auctions.server.auction.pricing import PAPER_RULE, PricingRule
from inference_auctions.server.auction.request import AuctionRequest, validate_batch
from inference_auctions.server.auction.schedule import average_bid_dfs
from inference_auctions.server.auction.tree import RadixTree, TreeStats, build_radix_tree

_EMPTY_STATS = TreeStats(requests=0, nodes=0, depth=0, total_tokens=0, unique_tokens=0)


@dataclass(frozen=True, slots=True)
class AuctionOutcome:
    """The cleared batch: who goes first, and what every user pays (micro-credits): the VCG
    charge (`payments`) and the request fees (`fees`), under the batch's pricing `rule`."""

    order: list[str]
    payments: dict[str, int]
    rule: PricingRule = PAPER_RULE
    fees: dict[str, int] = field(default_factory=dict)
    positions: dict[str, int] = field(default_factory=dict)
    bids: dict[str, int] = field(default_factory=dict)
    users: dict[str, str] = field(default_factory=dict)
    tree: TreeStats = _EMPTY_STATS
    # The radix tree the order was computed on, and the rids in the order they were given
    # (the tree's request indexes): what dispatch needs to see which requests share a prefix.
    radix_tree: RadixTree | None = field(default=None, repr=False, compare=False)
    arrival_order: list[str] = field(default_factory=list, repr=False, compare=False)
    # What pricing the batch again reads (`Repricer.from_outcome`), so it never builds the tree,
    # the schedule or the payments a second time: the schedule's positions and prefix sums, and
    # (n-1) * p of every user, unrounded.
    pricing: PaymentContext | None = field(default=None, repr=False, compare=False)
    numerators: dict[str, int] = field(default_factory=dict, repr=False, compare=False)

    @property
    def size(self) -> int:
        """Number of requests in the batch."""
        return len(self.order)

    @property
    def slots(self) -> int:
        """K, the priority slots a delay is measured in: n under the paper's rule."""
        return self.rule.slot_count(self.size)

    def priority(self, rid: str) -> Fraction:
        """Fractional priority (K-1-k)/(K-1) of the request at position k; 1 when K = 1."""
        if self.slots <= 1:
            return Fraction(1)
        return Fraction(self.slots - 1 - self.positions[rid], self.slots - 1)

    @property
    def priorities(self) -> dict[str, float]:
        """Fractional priority of every request, as floats for display and storage."""
        return {rid: float(self.priority(rid)) for rid in self.order}

    @property
    def welfare(self) -> Fraction:
        """W = sum of bid * fractional priority, exactly, in micro-credits. Every priority
        has the denominator K - 1, so the sum is taken over integers and divided once
        (`reference.welfare` sums the fractions; the property tests compare the two)."""
        if self.slots <= 1:
            return Fraction(sum(self.bids[rid] for rid in self.order))
        last = self.slots - 1
        weighted = sum(self.bids[rid] * (last - self.positions[rid]) for rid in self.order)
        return Fraction(weighted, last)

    @property
    def revenue(self) -> int:
        """Sum of the charged VCG payments (the fees not included)."""
        return sum(self.payments.values())

    @property
    def fee_revenue(self) -> int:
        """Sum of the request fees."""
        return sum(self.fees.values())

    def charge(self, user: str) -> int:
        """What the user pays for the batch: the VCG charge plus the user's request fees."""
        return self.payments.get(user, 0) + self.fees.get(user, 0)


def run_auction(
    requests: Sequence[AuctionRequest], rule: PricingRule = PAPER_RULE
) -> AuctionOutcome:
    """Clear a batch: average-bid DFS order and VCG payments, rounded down to whole micros,
    measured in the `rule`'s priority slots, and the rule's fee for every request.

    Raises `AuctionInputError` (a `ValueError`) naming the request and field when any request is
    malformed, or the batch holds more requests than the rule's slots; nothing is computed for
    a batch that fails validation.
    """
    batch = validate_batch(requests)
    if not batch.rids:
        return AuctionOutcome(order=[], payments={}, rule=rule)
    denominator = rule.denominator(len(batch.rids))
    tree = build_radix_tree(batch.prompts)
    pricing = PaymentContext(tree, average_bid_dfs(tree, batch.bids))
    if len(batch.rids) < 2:
        numerators = dict.fromkeys(batch.users, 0)
    else:
        numerators = pricing.numerators(batch.bids, batch.users)
    order = [batch.rids[index] for index in pricing.order]
    fees = dict.fromkeys(batch.users, 0)
    for user in batch.users:
        fees[user] += rule.request_fee_micros
    return AuctionOutcome(
        order=order,
        payments={user: value // denominator for user, value in numerators.items()},
        rule=rule,
        fees=fees,
        positions={rid: place for place, rid in enumerate(order)},
        bids=dict(zip(batch.rids, batch.bids, strict=True)),
        users=dict(zip(batch.rids, batch.users, strict=True)),
        tree=tree.stats,
        radix_tree=tree,
        arrival_order=batch.rids,
        pricing=pricing,
        numerators=numerators,
    )
