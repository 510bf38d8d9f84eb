"""Figure 4: users with pacing autobidders in repeated auctions on the tree workloads.

Every auction clears a fresh queue of 3-ary tree-of-thought trees; the k-th tree of every
queue belongs to user k (one user's reasoning job per auction). Each user bids through the
SDK's own `PacingBidder` under `Budget(B_u, auctions=T)`: `b = floor(alpha_u * v)`, with
`alpha_u` learned from the user's VCG charges.

Budgets are drawn before the paced run: the horizon is first cleared once with truthful bids
(the single-shot benchmark), and each user's budget is a uniform random share, between
`budget_share[0]` and `budget_share[1]`, of what truthful bidding charged them over it, so
budgets bind to different degrees and users pace differently. The paced run then clears the
very same queues.

Welfare is the value-weighted fractional priority of the auction's schedule, `W(sigma; v)`,
which is what Theorem 4.4 bounds: with per-node condition numbers `kappa_u` (max over min,
across a node's children with value, of `F_b(c) / F_v(c)`), the paced welfare is at least the
truthful (DFS-optimal) welfare divided by `max_u kappa_u`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from decimal import Decimal

import numpy as np

from inference_auctions.experiments.metrics import welfare, welfare_gain_percent
from inference_auctions.experiments.workloads import Workload, trees
from inference_auctions.sdk import Budget, PacingBidder
from inference_auctions.server.auction import AuctionOutcome, AuctionRequest, run_auction
from inference_auctions.server.auction.batch import build_radix_tree
from inference_auctions.server.auction.schedule import subtree_sums

__all__ = [
    "AutobidRun",
    "AutobidSettings",
    "condition_number",
    "run_autobidding",
]


@dataclass(frozen=True, slots=True)
class AutobidSettings:
    """The repeated market: horizon, queue per auction, and how tight budgets are."""

    auctions: int = 60
    queue: int = 1024
    budget_share: tuple[float, float] = (0.25, 1.0)
    eta0: float = 1.0


@dataclass(slots=True)
class AutobidRun:
    """One tree variant, one trial: per-auction welfare and every user's pacing path."""

    variant: str
    truthful: list[float] = field(default_factory=list)
    paced: list[float] = field(default_factory=list)
    bound: list[float] = field(default_factory=list)
    truthful_percent: list[float] = field(default_factory=list)
    paced_percent: list[float] = field(default_factory=list)
    kappa: list[float] = field(default_factory=list)
    budgets: dict[str, int] = field(default_factory=dict)
    alphas: dict[str, list[float]] = field(default_factory=dict)
    spend: dict[str, list[int]] = field(default_factory=dict)

    @property
    def welfare_ratio(self) -> float:
        """Paced welfare over truthful welfare, summed over the horizon."""
        return math.fsum(self.paced) / math.fsum(self.truthful)

    @property
    def bound_margin(self) -> float:
        """The smallest paced welfare over its Theorem 4.4 bound (>= 1 when the bound holds)."""
        return min(
            (w / b for w, b in zip(self.paced, self.bound, strict=True) if b > 0), default=math.inf
        )


def run_autobidding(
    variant: str,
    settings: AutobidSettings,
    *,
    seed: int,
    trial: int,
    advance: Callable[[], None] | None = None,
) -> AutobidRun:
    """Clear `settings.auctions` queues truthfully, then with pacing bidders; compare."""
    run = AutobidRun(variant)

    def queue(t: int) -> Workload:
        rng = np.random.default_rng([seed, trial, 4, 0 if variant == "short" else 1, t])
        return trees(variant, settings.queue, rng)

    spent_truthfully: dict[str, int] = {}
    for t in range(settings.auctions):
        workload = queue(t)
        values = workload.values
        outcome = _clear(workload, values)
        run.truthful.append(_welfare(outcome, values))
        run.truthful_percent.append(_percent(outcome, values))
        for user, charge in outcome.payments.items():
            spent_truthfully[user] = spent_truthfully.get(user, 0) + charge

    rng = np.random.default_rng([seed, trial, 4, 2])
    low, high = settings.budget_share
    bidders: dict[str, PacingBidder] = {}
    for user in sorted(spent_truthfully, key=_user_number):
        budget = max(1, int(rng.uniform(low, high) * spent_truthfully[user]))
        run.budgets[user] = budget
        bidders[user] = PacingBidder(
            Budget(Decimal(budget).scaleb(-6), auctions=settings.auctions, eta0=settings.eta0),
            clock=lambda: 0.0,
        )
        run.alphas[user], run.spend[user] = [], []

    for t in range(settings.auctions):
        workload = queue(t)
        values = workload.values
        bids = _paced_bids(workload, bidders, run.alphas)
        outcome = _clear(workload, bids)
        for user, bidder in bidders.items():
            reserved = sum(
                bids[i] for i, q in enumerate(workload.queries) if _user(q.group) == user
            )
            bidder.settle(f"auction-{t}", outcome.payments.get(user, 0), reserved=reserved)
            run.spend[user].append(bidder.spent_micros)
        kappa = condition_number(workload, bids)
        run.paced.append(_welfare(outcome, values))
        run.paced_percent.append(_percent(outcome, values))
        run.kappa.append(kappa)
        run.bound.append(run.truthful[t] / kappa if math.isfinite(kappa) else 0.0)
        if advance is not None:
            advance()
    return run


def condition_number(workload: Workload, bids: Sequence[int]) -> float:
    """max over nodes of kappa_u: max/min of F_b(c)/F_v(c) over children c with F_v(c) > 0."""
    tree = build_radix_tree([query.tokens for query in workload.queries])
    bid_sums = subtree_sums(tree, list(bids)).bid_sum
    value_sums = subtree_sums(tree, workload.values).bid_sum
    worst = 1.0
    for children in tree.children:
        ratios = [bid_sums[c] / value_sums[c] for c in children if value_sums[c] > 0]
        if len(ratios) < 2:
            continue
        if min(ratios) == 0:
            return math.inf
        worst = max(worst, max(ratios) / min(ratios))
    return worst


def _paced_bids(
    workload: Workload, bidders: dict[str, PacingBidder], alphas: dict[str, list[float]]
) -> list[int]:
    """Every query's bid from its user's bidder, one `bid` call per user per auction."""
    members: dict[str, list[int]] = {}
    for index, query in enumerate(workload.queries):
        members.setdefault(_user(query.group), []).append(index)
    bids = [0] * len(workload)
    for user, bidder in bidders.items():
        alphas[user].append(bidder.alpha)
        indexes = members.get(user, [])
        for index, bid in zip(
            indexes, bidder.bid([workload.queries[i].value for i in indexes]), strict=True
        ):
            bids[index] = bid
    return bids


def _clear(workload: Workload, bids: Sequence[int]) -> AuctionOutcome:
    requests = [
        AuctionRequest(str(i), _user(q.group), q.tokens, bid)
        for i, (q, bid) in enumerate(zip(workload.queries, bids, strict=True))
    ]
    return run_auction(requests)


def _priorities(outcome: AuctionOutcome) -> list[float]:
    return [float(outcome.priority(str(i))) for i in range(outcome.size)]


def _welfare(outcome: AuctionOutcome, values: Sequence[int]) -> float:
    return welfare(values, _priorities(outcome))


def _percent(outcome: AuctionOutcome, values: Sequence[int]) -> float:
    return welfare_gain_percent(values, _priorities(outcome))


def _user(group: int) -> str:
    return f"user-{group}"


def _user_number(user: str) -> int:
    return int(user.removeprefix("user-"))
