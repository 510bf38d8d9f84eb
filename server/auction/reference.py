"""Slow, obviously correct implementations of the mechanism: the oracles for the fast core.

They share no code with the fast path. The trie here has one node per token (no compaction),
averages are `Fraction`s, payments re-solve the whole auction once per user with that user's
bids zeroed (the definition of VCG in SPEC section 1), and `all_dfs_orders` enumerates every
DFS schedule for brute-force checks on small batches.

Every function takes the batch's priority slots `slots` (K): None is the batch's own size
(the paper's rule), a number is the fixed-slots rule (docs/SPEC.md), under which the request at
position k has priority (K-1-k)/(K-1). The request fee is not here: it is a flat amount per
request that no bid moves (`reference_fees`).

One oracle sits between the two: `ResolvingRepricer` prices a charge with some bids zeroed the
straightforward way, by re-solving the fast core's schedule and payment with those bids set to
0 (what `Repricer` did before it priced them from the chosen schedule). It is exact and fast
enough for batches of hundreds, so it checks the repricing fast path where the trie cannot.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction

from inference_auctions.server.auction.batch import AuctionRequest, build_radix_tree, validate_batch
from inference_auctions.server.auction.charges import largest_remainder, user_payment_numerator
from inference_auctions.server.auction.schedule import average_bid_dfs


@dataclass
class _TrieNode:
    children: dict[int, _TrieNode] = field(default_factory=dict)
    requests: list[int] = field(default_factory=list)  # request leaves hanging here

    def items(self) -> list[tuple[str, int | _TrieNode]]:
        """Children of this node in the augmented tree: token subtrees and request leaves."""
        subtrees: list[tuple[str, int | _TrieNode]] = [("node", c) for c in self.children.values()]
        return subtrees + [("leaf", r) for r in self.requests]


def _trie(requests: Sequence[AuctionRequest]) -> _TrieNode:
    root = _TrieNode()
    for index, request in enumerate(requests):
        node = root
        for token in request.tokens:
            node = node.children.setdefault(int(token), _TrieNode())
        node.requests.append(index)
    return root


def _leaves(item: tuple[str, int | _TrieNode]) -> list[int]:
    kind, value = item
    if kind == "leaf":
        assert isinstance(value, int)
        return [value]
    assert isinstance(value, _TrieNode)
    return [leaf for child in value.items() for leaf in _leaves(child)]


def reference_order(requests: Sequence[AuctionRequest], bids: Sequence[int]) -> list[int]:
    """The average-bid DFS: children by decreasing Fraction(F, N), ties by earliest arrival."""

    def visit(item: tuple[str, int | _TrieNode]) -> list[int]:
        kind, value = item
        if kind == "leaf":
            assert isinstance(value, int)
            return [value]
        assert isinstance(value, _TrieNode)

        def key(child: tuple[str, int | _TrieNode]) -> tuple[Fraction, int]:
            leaves = _leaves(child)
            return (-Fraction(sum(bids[r] for r in leaves), len(leaves)), min(leaves))

        return [r for child in sorted(value.items(), key=key) for r in visit(child)]

    return visit(("node", _trie(requests)))


def all_dfs_orders(requests: Sequence[AuctionRequest]) -> Iterator[list[int]]:
    """Every DFS schedule of the batch (exponential: for small batches only)."""

    def visit(item: tuple[str, int | _TrieNode]) -> Iterator[list[int]]:
        kind, value = item
        if kind == "leaf":
            assert isinstance(value, int)
            yield [value]
            return
        assert isinstance(value, _TrieNode)
        for permutation in itertools.permutations(value.items()):
            for parts in itertools.product(*(list(visit(child)) for child in permutation)):
                yield [r for part in parts for r in part]

    yield from visit(("node", _trie(requests)))


def priority(position: int, size: int, slots: int | None = None) -> Fraction:
    """(K-1-k)/(K-1) for the request at 0-based `position` k, K = `slots` or the batch size."""
    k_slots = size if slots is None else slots
    assert size <= k_slots, "a batch never holds more requests than its slots"
    if k_slots <= 1:
        return Fraction(1)
    return Fraction(k_slots - 1 - position, k_slots - 1)


def welfare(order: Sequence[int], bids: Sequence[int], slots: int | None = None) -> Fraction:
    """W(order; bids) = sum of bid * (K-1-k)/(K-1), exactly."""
    size = len(order)
    return sum((bids[r] * priority(k, size, slots) for k, r in enumerate(order)), start=Fraction(0))


def reference_payments(
    requests: Sequence[AuctionRequest], slots: int | None = None
) -> dict[str, Fraction]:
    """Exact VCG payments by re-solving the auction with each user's bids zeroed."""
    bids = [request.bid for request in requests]
    chosen = reference_order(requests, bids)
    payments: dict[str, Fraction] = {}
    for user in dict.fromkeys(request.user for request in requests):
        without = [0 if request.user == user else request.bid for request in requests]
        best = welfare(reference_order(requests, without), without, slots)
        payments[user] = best - welfare(chosen, without, slots)
    return payments


def reference_fees(requests: Sequence[AuctionRequest], fee: int) -> dict[str, int]:
    """Every user's request fees: `fee` for each of the user's requests, zero bids included."""
    fees: dict[str, int] = {}
    for request in requests:
        fees[request.user] = fees.get(request.user, 0) + fee
    return fees


def reference_charge(
    requests: Sequence[AuctionRequest], user: str, zeroed: set[str], slots: int | None = None
) -> int:
    """The user's charge (floored micros) when the bids of `zeroed` are set to zero."""
    changed = [
        AuctionRequest(r.rid, r.user, r.tokens, 0 if r.rid in zeroed else r.bid) for r in requests
    ]
    return math.floor(reference_payments(changed, slots).get(user, Fraction(0)))


def reference_failure_refund(
    requests: Sequence[AuctionRequest], user: str, failed: set[str], slots: int | None = None
) -> int:
    """Charge minus the charge with the failed requests' bids zeroed, clipped to [0, charge]."""
    charge = reference_charge(requests, user, set(), slots)
    return min(max(charge - reference_charge(requests, user, failed, slots), 0), charge)


def reference_shares(
    requests: Sequence[AuctionRequest], user: str, slots: int | None = None
) -> dict[str, int]:
    """The user's charge split by marginals (else bids, else equally), largest remainder."""
    charge = reference_charge(requests, user, set(), slots)
    mine = [r for r in requests if r.user == user]
    positions = {
        requests[index].rid: place
        for place, index in enumerate(reference_order(requests, [r.bid for r in requests]))
    }
    weights = {
        r.rid: min(max(charge - reference_charge(requests, user, {r.rid}, slots), 0), charge)
        for r in mine
    }
    if not any(weights.values()):
        weights = {r.rid: r.bid for r in mine}
    if not any(weights.values()):
        weights = {r.rid: 1 for r in mine}
    exact = {rid: Fraction(charge * w, sum(weights.values())) for rid, w in weights.items()}
    shares = {rid: math.floor(value) for rid, value in exact.items()}
    # Hand out the units left one at a time: largest fractional part, then earliest position.
    for _ in range(charge - sum(shares.values())):
        best = max(
            (rid for rid in exact if shares[rid] == math.floor(exact[rid])),
            key=lambda rid: (exact[rid] - math.floor(exact[rid]), -positions[rid]),
        )
        shares[best] += 1
    return shares


class ResolvingRepricer:
    """A user's charge with some bids zeroed, by re-solving the batch for every question."""

    def __init__(self, requests: Sequence[AuctionRequest], slots: int | None = None) -> None:
        batch = validate_batch(requests)
        self._slots = len(batch.rids) if slots is None else slots
        self._tree = build_radix_tree(batch.prompts)
        self._bids = batch.bids
        self._users = batch.users
        self._rids = batch.rids
        self._index = {rid: index for index, rid in enumerate(batch.rids)}

    def charge(self, user: str, zeroed: Collection[str] = ()) -> int:
        """The user's VCG charge in micros (floored) with the bids of `zeroed` set to 0."""
        bids = list(self._bids)
        for rid in zeroed:
            bids[self._index[rid]] = 0
        if len(bids) < 2:
            return 0
        schedule = average_bid_dfs(self._tree, bids)
        mine = [index for index, owner in enumerate(self._users) if owner == user]
        numerator = user_payment_numerator(self._tree, schedule, bids, mine)
        return numerator // max(self._slots - 1, 1)

    def shares(self, user: str, charge: int, positions: Mapping[str, int]) -> dict[str, int]:
        """The user's charge split by marginals (else bids, else equally), largest remainder."""
        rids = [rid for rid, owner in zip(self._rids, self._users, strict=True) if owner == user]
        if len(rids) == 1:
            return {rids[0]: charge}
        marginals = [min(max(charge - self.charge(user, [rid]), 0), charge) for rid in rids]
        if not any(marginals):
            marginals = [self._bids[self._index[rid]] for rid in rids]
        if not any(marginals):
            marginals = [1] * len(rids)
        return largest_remainder(charge, dict(zip(rids, marginals, strict=True)), positions)


def reference_rolling_charges(
    pool: Sequence[AuctionRequest], dispatched: Collection[str], slots: int
) -> dict[str, int]:
    """The rolling auction's charges by brute force (SPEC section 7): for every user with a
    dispatched request, the best welfare of the others over every DFS order of the whole pool
    with the user's dispatched bids at 0, less their welfare on the chosen order, in `slots`
    slots, floored and capped at the dispatched bids."""
    bids = [request.bid for request in pool]
    chosen = reference_order(pool, bids)
    orders = list(all_dfs_orders(pool))

    def served_after(order: Sequence[int], values: Sequence[int]) -> int:
        # (K-1) W differs from this by a term no order changes.
        return sum(values[r] * (len(order) - 1 - k) for k, r in enumerate(order))

    charges: dict[str, int] = {}
    for user in dict.fromkeys(r.user for r in pool if r.rid in dispatched):
        mine = {i for i, r in enumerate(pool) if r.user == user and r.rid in dispatched}
        without = [0 if i in mine else bid for i, bid in enumerate(bids)]
        best = max(served_after(order, without) for order in orders)
        numerator = best - served_after(chosen, without)
        charges[user] = min(numerator // max(slots - 1, 1), sum(bids[i] for i in mine))
    return charges
