"""Charges recomputed with some bids set to zero: failure refunds and per-request shares.

Both rules (SPEC section 1, "When requests fail" and "One request's share") price a user's
requests by what they add to the user's VCG charge. A `Repricer` builds the batch's radix tree
once and re-solves only the schedule and the one user's payment for each question, so pricing
every request of a batch stays linear in its size per question.

A batch's tree can be rebuilt without its prompts: `tree_paths` gives each request the node ids
on its way from the root, and those paths, used as prompts, build a tree of the same shape. The
ledger stores them, so crash recovery can apply the same refund rule as the server.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

from inference_auctions.server.auction.payments import user_payment_numerator
from inference_auctions.server.auction.request import AuctionRequest, validate_batch
from inference_auctions.server.auction.schedule import average_bid_dfs
from inference_auctions.server.auction.tree import NO_PARENT, ROOT, build_radix_tree


class Repricer:
    """One batch, ready to be priced again with any of its requests' bids set to zero."""

    def __init__(self, requests: Sequence[AuctionRequest]) -> None:
        batch = validate_batch(requests)
        self._tree = build_radix_tree(batch.prompts)
        self._rids = batch.rids
        self._bids = batch.bids
        self._users = batch.users
        self._index = {rid: index for index, rid in enumerate(batch.rids)}

    def requests_of(self, user: str) -> list[str]:
        """The user's request ids, in arrival order."""
        return [rid for rid, owner in zip(self._rids, self._users, strict=True) if owner == user]

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
        return numerator // (len(bids) - 1)

    def failure_refund(self, user: str, failed: Collection[str], charge: int) -> int:
        """What the user gets back when `failed` (the user's requests) were not served."""
        return min(max(charge - self.charge(user, failed), 0), charge)

    def shares(self, user: str, charge: int, positions: Mapping[str, int]) -> dict[str, int]:
        """Split the user's charge over the user's requests; the shares sum to `charge`."""
        rids = self.requests_of(user)
        if len(rids) == 1:
            return {rids[0]: charge}
        marginals = [min(max(charge - self.charge(user, [rid]), 0), charge) for rid in rids]
        if not any(marginals):
            marginals = [self._bids[self._index[rid]] for rid in rids]
        if not any(marginals):
            marginals = [1] * len(rids)
        return largest_remainder(charge, dict(zip(rids, marginals, strict=True)), positions)

    def tree_paths(self) -> dict[str, list[int]]:
        """Each request's path of node ids from the root: prompts that rebuild the tree's shape."""
        tree = self._tree
        paths: dict[str, list[int]] = {}
        for index, rid in enumerate(self._rids):
            path: list[int] = []
            node = tree.parent[tree.leaf_of[index]]
            while node not in (ROOT, NO_PARENT):
                path.append(node)
                node = tree.parent[node]
            paths[rid] = path[::-1]
        return paths


def largest_remainder(
    total: int, weights: Mapping[str, int], positions: Mapping[str, int]
) -> dict[str, int]:
    """Split `total` in proportion to `weights` (not all 0) into integers that sum to it.

    Each gets the floor of its exact share; the units left over go to the largest remainders,
    ties to the earlier position.
    """
    weight_sum = sum(weights.values())
    shares = {rid: total * weight // weight_sum for rid, weight in weights.items()}
    left = total - sum(shares.values())
    by_remainder = sorted(
        weights, key=lambda rid: (-(total * weights[rid] % weight_sum), positions[rid])
    )
    for rid in by_remainder[:left]:
        shares[rid] += 1
    return shares
