"""Charges recomputed with some bids set to zero: failure refunds and per-request shares.

Both rules (SPEC section 1, "When requests fail" and "One request's share") price a user's
requests by what they add to the user's VCG charge. A `Repricer` works on the batch's radix
tree, schedule and payments as `run_auction` left them (`Repricer.from_outcome`), or builds
them once from the requests; each question is then priced from the chosen schedule by
`marginals.ZeroedCharges`, touching only the nodes above the zeroed requests, so splitting
every user's charge over a batch costs O(n * depth * log(branching)), not a re-solve per
request.

A batch's tree can be rebuilt without its prompts: `tree_paths` gives each request the node ids
on its way from the root, and those paths, used as prompts, build a tree of the same shape. The
ledger stores them, so crash recovery can apply the same refund rule as the server.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

from inference_auctions.server.auction.marginals import ZeroedCharges
from inference_auctions.server.auction.mechanism import AuctionOutcome, run_auction
from inference_auctions.server.auction.payments import PaymentContext
from inference_auctions.server.auction.pricing import PAPER_RULE, PricingRule
from inference_auctions.server.auction.request import AuctionRequest
from inference_auctions.server.auction.tree import node_paths


class Repricer:
    """One batch, ready to be priced again with any of its requests' bids set to zero."""

    def __init__(self, requests: Sequence[AuctionRequest], rule: PricingRule = PAPER_RULE) -> None:
        """Clear `requests` under `rule` to price them; a batch already cleared goes to
        `from_outcome`."""
        self._take(run_auction(requests, rule))

    @classmethod
    def from_outcome(cls, outcome: AuctionOutcome) -> Repricer:
        """The repricer of a batch `run_auction` cleared: its tree and schedule, not rebuilt."""
        repricer = cls.__new__(cls)
        repricer._take(outcome)
        return repricer

    def _take(self, outcome: AuctionOutcome) -> None:
        self._rids = outcome.arrival_order
        self._bids = [outcome.bids[rid] for rid in self._rids]
        self._index = {rid: index for index, rid in enumerate(self._rids)}
        self._by_user: dict[str, list[int]] = {}
        for index, rid in enumerate(self._rids):
            self._by_user.setdefault(outcome.users[rid], []).append(index)
        self._pricing: PaymentContext | None = outcome.pricing
        self._numerators = outcome.numerators
        self._denominator = outcome.rule.denominator(len(self._rids))
        self._users: dict[str, ZeroedCharges] = {}

    def requests_of(self, user: str) -> list[str]:
        """The user's request ids, in arrival order."""
        return [self._rids[index] for index in self._by_user.get(user, [])]

    def charge(self, user: str, zeroed: Collection[str] = ()) -> int:
        """The user's VCG charge in micros (floored) with the bids of `zeroed` set to 0."""
        if len(self._rids) < 2 or user not in self._by_user:
            return 0
        charges = self._charges(user)
        numerator = charges.numerator
        if zeroed:
            numerator = charges.numerator_without({self._index[rid] for rid in zeroed})
        return numerator // self._denominator

    def failure_refund(self, user: str, failed: Collection[str], charge: int) -> int:
        """What the user gets back when `failed` (the user's requests) were not served."""
        return min(max(charge - self.charge(user, failed), 0), charge)

    def shares(self, user: str, charge: int, positions: Mapping[str, int]) -> dict[str, int]:
        """Split the user's charge over the user's requests; the shares sum to `charge`."""
        rids = self.requests_of(user)
        if charge == 0:  # nothing to split, whatever the marginals
            return dict.fromkeys(rids, 0)
        if len(rids) == 1:
            return {rids[0]: charge}
        # m_r = clip(c - c({r}), 0, c), each c({r}) priced from the chosen schedule.
        charges, denominator = self._charges(user), self._denominator
        marginals = [
            min(max(charge - charges.numerator_without_one(index) // denominator, 0), charge)
            for index in self._by_user[user]
        ]
        if not any(marginals):
            marginals = [self._bids[self._index[rid]] for rid in rids]
        if not any(marginals):
            marginals = [1] * len(rids)
        return largest_remainder(charge, dict(zip(rids, marginals, strict=True)), positions)

    def tree_paths(self) -> dict[str, list[int]]:
        """Each request's path of node ids from the root: prompts that rebuild the tree's shape."""
        if self._pricing is None:
            return {rid: [] for rid in self._rids}
        return dict(zip(self._rids, node_paths(self._pricing.tree, len(self._rids)), strict=True))

    def _charges(self, user: str) -> ZeroedCharges:
        charges = self._users.get(user)
        if charges is None:
            assert self._pricing is not None  # a batch of two or more requests has one
            charges = ZeroedCharges(
                self._pricing, self._bids, self._by_user[user], self._numerators[user]
            )
            self._users[user] = charges
        return charges


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
