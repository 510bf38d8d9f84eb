"""What a batch charges: the pricing rule, `run_auction` and its outcome, the exact VCG
payments, and the same charges priced again with some bids set to zero.

Read from the top, it follows one batch as the server clears it:

* `PricingRule`: how many priority slots a delay is measured in, and the request fee;
* `run_auction`: the batch validated and its radix tree built (`batch`), ordered by the
  average-bid DFS (`schedule`), every user's VCG charge computed (`PaymentContext`), all of it
  returned as an `AuctionOutcome`;
* `PaymentContext`: exact VCG payments in quasilinear time (SPEC section 1, "Fast payments");
* `Repricer` and `ZeroedCharges`: the failure refunds and the per-request shares of a cleared
  batch, priced from the schedule it chose (SPEC section 1, "When requests fail" and "One
  request's share"); `node_paths` is the tree's shape the ledger stores to price a batch again
  after a crash, `largest_remainder` splits a charge into whole micros.

Pure functions of their input: no I/O, no clock, no randomness. Money is whole micro-credits.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from itertools import accumulate
from typing import Literal, Protocol

from inference_auctions.server.auction.batch import (
    NO_PARENT,
    ROOT,
    AuctionRequest,
    RadixTree,
    TreeStats,
    build_radix_tree,
    validate_batch,
)
from inference_auctions.server.auction.errors import AuctionInputError
from inference_auctions.server.auction.schedule import AverageBidKey, Schedule, average_bid_dfs

RuleName = Literal["batch-size", "fixed-slots", "rolling-slots", "tiers", "fcfs"]
Mode = Literal["auction", "tiers", "fcfs"]
# The rule of every batch cleared before the rule was recorded with each batch.
BATCH_SIZE: RuleName = "batch-size"
FIXED_SLOTS: RuleName = "fixed-slots"
# Fixed slots, each head of the waiting pool charged for its delay to the whole pool (`rolling`).
ROLLING_SLOTS: RuleName = "rolling-slots"
# The rules of the fixed-price modes (`fixed_price`): a request pays the price it was admitted
# at (its tier's, or nothing).
FIXED_PRICE_RULES: frozenset[str] = frozenset({"tiers", "fcfs"})


@dataclass(frozen=True, slots=True)
class PricingRule:
    """`slots`: the K a delay is measured in (None: the batch's own size, the `batch-size`
    rule); `request_fee_micros`: what every request of the batch pays besides its VCG charge;
    `mode`: `auction`, or one of the fixed-price modes (`tiers`, `fcfs`), which have neither.

    `batch-size` is the rule of the paper: the request at 0-based position k of a batch of n
    gets priority (n-1-k)/(n-1), so every slot of delay is worth 1/(n-1) of a bid, and n
    zero-bid requests with fresh prompts divide every charge in the batch. `fixed-slots`
    measures every batch against the same K slots, K >= n: priority (K-1-k)/(K-1). The schedule
    is the same (the two welfares differ by a term no order changes), and so are the VCG
    numerators; only the denominator is K-1 instead of n-1, so requests that add nothing to
    anyone's delay lower no charge. The fee is a flat amount per request, zero bids included, on
    top of the VCG charge: what makes a decoy request cost its sender.

    The two other pricing modes of a server record their own names: `tiers` (each request pays
    its tier's fixed price, dearer tiers first) and `fcfs` (arrival order, nothing charged);
    they are cleared by `fixed_price`, not by the auction, and their batches' priorities are
    measured in the batch's own size, for display.

    `rolling`: the batch is the head of a waiting pool ordered whole, each user charged for the
    delay its head requests impose on the pool (`rolling`, SPEC section 7); fixed slots only.
    """

    slots: int | None = None
    request_fee_micros: int = 0
    mode: Mode = "auction"
    rolling: bool = False

    def __post_init__(self) -> None:
        if self.mode != "auction" and (self.slots is not None or self.request_fee_micros):
            raise ValueError(f"the {self.mode} mode has no priority slots and no request fee")
        if self.rolling and (self.mode != "auction" or self.slots is None):
            raise ValueError("the rolling rule prices fixed slots: it needs priority slots")
        if self.slots is not None and (type(self.slots) is not int or self.slots < 1):
            raise ValueError(f"priority slots must be a whole number >= 1, got {self.slots!r}")
        fee = self.request_fee_micros
        if type(fee) is not int or fee < 0:
            raise ValueError(f"the request fee must be whole micro-credits >= 0, got {fee!r}")

    @property
    def name(self) -> RuleName:
        """`batch-size`, `fixed-slots`, `tiers` or `fcfs`: what the ledger records with each
        batch."""
        if self.mode != "auction":
            return self.mode
        if self.rolling:
            return ROLLING_SLOTS
        return BATCH_SIZE if self.slots is None else FIXED_SLOTS

    @property
    def fixed_price(self) -> bool:
        """Whether a request pays the price it was admitted at (`tiers`, `fcfs`)."""
        return self.mode != "auction"

    def slot_count(self, size: int) -> int:
        """The K of a batch of `size` requests; a batch may not hold more requests than K."""
        if self.slots is None:
            return size
        if size > self.slots:
            raise AuctionInputError.too_many_requests(size, self.slots)
        return self.slots

    def denominator(self, size: int) -> int:
        """K - 1 (at least 1): every exact payment is a whole numerator over it."""
        return max(self.slot_count(size) - 1, 1)


# The default of `run_auction`: the paper's rule, no fee.
PAPER_RULE = PricingRule()


class ByNode(Protocol):
    """A number per node (or per request index): a list, or a lookup computed on demand."""

    def __getitem__(self, node: int, /) -> int: ...


class ChildrenByNode(Protocol):
    """Each node's children in their served order."""

    def __getitem__(self, node: int, /) -> list[int]: ...


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
    # Under a posted price floor (`price_floor`), each entrant's floor part, by rid.
    floors: dict[str, int] = field(default_factory=dict)
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
    batch = validate_batch(requests, rule.slots)
    if not batch.rids:
        return AuctionOutcome(order=[], payments={}, rule=rule)
    tree = build_radix_tree(batch.prompts)
    pricing = PaymentContext(tree, average_bid_dfs(tree, batch.bids))
    denominator = rule.denominator(len(batch.rids))
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


def vcg_payment_numerators(
    tree: RadixTree, schedule: Schedule, bids: Sequence[int], users: Sequence[str]
) -> dict[str, int]:
    """Return (n-1) * p_i, an exact integer, for every user of the batch."""
    if len(bids) < 2:
        return dict.fromkeys(users, 0)
    return PaymentContext(tree, schedule).numerators(bids, users)


def user_payment_numerator(
    tree: RadixTree, schedule: Schedule, bids: Sequence[int], requests: list[int]
) -> int:
    """(n-1) * p of the one user who sent `requests` (indexes into `bids`)."""
    if len(bids) < 2:
        return 0
    return PaymentContext(tree, schedule).user_numerator(requests, bids)


class PaymentContext:
    """What every user's payment reads: positions, preorder ranks, per-node prefix sums.

    Built once per batch; repricing (`ZeroedCharges`) reads the same fields.

    With Phi = (n-1) * W, Phi splits over the tree's nodes: a node whose children are served in
    the order c_1..c_d contributes sum_{j<k} N(c_k) * F(c_j). Zeroing user i's bids lowers F
    only on the paths from the root to i's leaves, so (n-1) * p_i is a sum, over those nodes, of
    the best order's contribution minus the chosen order's contribution under the reduced sums G.

    At such a node the unaffected children keep their relative order. An affected child a (its
    sum drops from F(a) to G(a)) can only move later: it is overtaken exactly by the unaffected
    children after it whose average exceeds G(a)/N(a), a contiguous run of the sorted children
    found by binary search, and each overtaking pair (a, k) gains N(a)*F(k) - N(k)*G(a). The
    affected children among themselves are re-sorted by G/N, and their gain is the difference of
    two pair sums.
    """

    tree: RadixTree | None
    parent: ByNode
    leaf_of: ByNode
    ordered_children: ChildrenByNode
    count: ByNode
    bid_sum: ByNode
    first: ByNode
    position: ByNode
    rank: ByNode

    def __init__(self, tree: RadixTree, schedule: Schedule) -> None:
        self.tree = tree
        self.parent = tree.parent
        self.leaf_of = tree.leaf_of
        self.ordered_children = schedule.ordered_children
        self.count = schedule.sums.count
        self.bid_sum = schedule.sums.bid_sum
        self.first = schedule.sums.first
        self.order = schedule.order
        position = [0] * len(tree.parent)
        for kids in schedule.ordered_children:
            for place, child in enumerate(kids):
                position[child] = place
        self.position = position
        rank = [0] * len(tree.parent)
        for place, node in enumerate(tree.preorder):
            rank[node] = place
        self.rank = rank
        self._prefixes: dict[int, tuple[list[int], list[int]]] = {}

    @classmethod
    def from_parts(
        cls,
        *,
        parent: ByNode,
        leaf_of: ByNode,
        ordered_children: ChildrenByNode,
        position: ByNode,
        rank: ByNode,
        count: ByNode,
        bid_sum: ByNode,
        first: ByNode,
    ) -> PaymentContext:
        """The payments over a tree kept elsewhere (`pool_tree`), read through lookups by node:
        `rank` orders children after their parents (any such numbering), `leaf_of` maps a
        request's index to its leaf. The service order is not needed and not set."""
        context = cls.__new__(cls)
        context.tree = None
        context.parent, context.leaf_of = parent, leaf_of
        context.ordered_children, context.position, context.rank = ordered_children, position, rank
        context.count, context.bid_sum, context.first = count, bid_sum, first
        context.order = []
        context._prefixes = {}
        return context

    def numerators(self, bids: Sequence[int], users: Sequence[str]) -> dict[str, int]:
        """(n-1) * p_i for every user of a batch of two or more requests."""
        by_user: dict[str, list[int]] = {}
        for index, user in enumerate(users):
            by_user.setdefault(user, []).append(index)
        return {user: self.user_numerator(requests, bids) for user, requests in by_user.items()}

    def user_numerator(self, requests: list[int], bids: Sequence[int]) -> int:
        """(n-1) times the payment of the user who sent `requests`."""
        parent = self.parent
        # drop[u] = the user's bids under u, i.e. F(u) - G(u); only nodes with a positive drop
        # change, so the walk up from each leaf stops at the first node already reached.
        drop: dict[int, int] = {}
        for index in requests:
            if bids[index] == 0:
                continue
            leaf = self.leaf_of[index]
            drop[leaf] = bids[index]
            up = parent[leaf]
            while up != NO_PARENT and up not in drop:
                drop[up] = 0
                up = parent[up]
        affected: dict[int, list[int]] = {}
        for node in sorted(drop, key=self.rank.__getitem__, reverse=True):
            up = parent[node]
            if up != NO_PARENT:
                drop[up] += drop[node]
                affected.setdefault(up, []).append(node)
        return sum(self._node_gain(node, kids, drop) for node, kids in affected.items())

    def _node_gain(self, node: int, affected: list[int], drop: dict[int, int]) -> int:
        order = self.ordered_children[node]
        if len(order) < 2:
            return 0
        count, bid_sum, position = self.count, self.bid_sum, self.position
        prefix_f, prefix_n = self.prefix_sums(node)
        if len(affected) == 1:  # the common case: one path of the user runs through here
            child = affected[0]
            n_a, g_a, start = count[child], bid_sum[child] - drop[child], position[child] + 1
            end = self._overtaken_until(order, start, n_a, g_a)
            return n_a * (prefix_f[end] - prefix_f[start]) - g_a * (prefix_n[end] - prefix_n[start])
        affected.sort(key=position.__getitem__)
        places = [position[child] for child in affected]
        affected_f = [0, *accumulate(bid_sum[child] for child in affected)]
        affected_n = [0, *accumulate(count[child] for child in affected)]
        reduced = [bid_sum[child] - drop[child] for child in affected]

        gain = 0
        for s, child in enumerate(affected):
            n_a, g_a, start = count[child], reduced[s], places[s] + 1
            low = self._overtaken_until(order, start, n_a, g_a)
            if low == start:
                continue
            last = bisect_left(places, low, lo=s + 1)
            run_f = prefix_f[low] - prefix_f[start] - (affected_f[last] - affected_f[s + 1])
            run_n = prefix_n[low] - prefix_n[start] - (affected_n[last] - affected_n[s + 1])
            gain += n_a * run_f - g_a * run_n

        if len(affected) > 1:
            slots = range(len(affected))
            best = sorted(slots, key=lambda s: AverageBidKey(reduced[s], count[affected[s]], s))
            gain += self._pair_sum(best, affected, reduced) - self._pair_sum(
                slots, affected, reduced
            )
        return gain

    def _overtaken_until(self, order: list[int], start: int, n_a: int, g_a: int) -> int:
        """First place from `start` on whose average is not above G(a)/N(a) (binary search:
        the children are sorted by decreasing average)."""
        bid_sum, count = self.bid_sum, self.count
        low, high = start, len(order)
        while low < high:
            middle = (low + high) // 2
            other = order[middle]
            if bid_sum[other] * n_a > g_a * count[other]:
                low = middle + 1
            else:
                high = middle
        return low

    def _pair_sum(self, slots: Sequence[int], affected: list[int], reduced: list[int]) -> int:
        """sum_{j<k} N(c_k) * G(c_j) for the affected children served in the order `slots`."""
        total = 0
        before = 0
        for s in slots:
            total += self.count[affected[s]] * before
            before += reduced[s]
        return total

    def prefix_sums(self, node: int) -> tuple[list[int], list[int]]:
        """Prefix sums of F and of N over the node's children in their served order."""
        cached = self._prefixes.get(node)
        if cached is None:
            order = self.ordered_children[node]
            cached = (
                [0, *accumulate(self.bid_sum[child] for child in order)],
                [0, *accumulate(self.count[child] for child in order)],
            )
            self._prefixes[node] = cached
        return cached


class Repricer:
    """One batch, ready to be priced again with any of its requests' bids set to zero.

    Both rules (SPEC section 1, "When requests fail" and "One request's share") price a user's
    requests by what they add to the user's VCG charge. A `Repricer` works on the batch's radix
    tree, schedule and payments as `run_auction` left them (`Repricer.from_outcome`), or builds
    them once from the requests; each question is then priced from the chosen schedule by
    `ZeroedCharges`, touching only the nodes above the zeroed requests, so splitting
    every user's charge over a batch costs O(n * depth * log(branching)), not a re-solve per
    request.

    A batch's tree can be rebuilt without its prompts: `tree_paths` gives each request the node
    ids on its way from the root, and those paths, used as prompts, build a tree of the same
    shape. The ledger stores them, so crash recovery can apply the same refund rule as the
    server.
    """

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
        tree = self._pricing.tree
        assert tree is not None  # a batch's own context, built from its tree
        return dict(zip(self._rids, node_paths(tree, len(self._rids)), strict=True))

    def _charges(self, user: str) -> ZeroedCharges:
        charges = self._users.get(user)
        if charges is None:
            assert self._pricing is not None  # a batch of two or more requests has one
            charges = ZeroedCharges(
                self._pricing, self._bids, self._by_user[user], self._numerators[user]
            )
            self._users[user] = charges
        return charges


def node_paths(tree: RadixTree, count: int) -> list[list[int]]:
    """Each of the first `count` requests' node ids on the way from the root to its leaf: used
    as prompts, they rebuild a tree of the same shape (what the ledger stores for refunds)."""
    paths: list[list[int]] = []
    for index in range(count):
        path: list[int] = []
        node = tree.parent[tree.leaf_of[index]]
        while node not in (ROOT, NO_PARENT):
            path.append(node)
            node = tree.parent[node]
        path.reverse()
        paths.append(path)
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


class ZeroedCharges:
    """One user's charge numerator with any subset of the user's requests' bids zeroed.

    The failure refund and the per-request shares (SPEC section 1) both need c(Z): the user's
    charge with the bids of Z, a set of the user's requests, set to 0. Re-solving the batch for
    every Z costs a whole schedule and payment each time; this prices Z from the schedule already
    chosen, touching only the nodes above Z's leaves.

    With Phi(order; v) = sum over requests of v * (requests served after it) = (n-1) * W, the
    user u pays (n-1) * p_u = max Phi(.; v) - Phi(chosen; v), where v are the bids with all of
    u's zeroed. Zeroing more of u's own bids leaves v as it is, so the first term does not
    move, and

        (n-1) * p_u(Z) = (n-1) * p_u + Phi(chosen; v) - Phi(chosen after Z; v).

    Phi splits over the nodes: a node whose children are served c_1..c_d adds
    sum_{j<k} N(c_k) * V(c_j), V(c) = the sum of v under c. Zeroing Z lowers F only on the paths
    from the root to Z's leaves, so only the children orders of the nodes on them change, and
    there only the children above a zeroed bid (the affected ones) move, each to a later place:
    past the run of children after it that its lowered average no longer beats (a binary search
    in the sorted children, with the schedule's own tie rule, earliest arrival first). Each pair
    (a, k) that swaps changes Phi by N(a) * V(k) - N(k) * V(a); the affected children among
    themselves are sorted again, and their part is the difference of two pair sums. For one
    request that is one binary search per node on its path: O(depth * log(branching)) instead of
    a re-solve.
    """

    def __init__(
        self, context: PaymentContext, bids: Sequence[int], requests: list[int], numerator: int
    ) -> None:
        """`requests`: the user's request indexes; `numerator`: (n-1) times the user's payment."""
        self._context = context
        self._bids = bids
        self.numerator = numerator
        tree = context
        # mine[node] = the user's bids under the node, for every node above one of them.
        mine: dict[int, int] = {}
        for index in requests:
            bid = bids[index]
            node = tree.leaf_of[index]
            while node != NO_PARENT:
                mine[node] = mine.get(node, 0) + bid
                node = tree.parent[node]
        self._mine = mine
        # Per node, its children that hold some of the user's bids: their places in the
        # served order, sorted, and the prefix sums of those bids, to sum them over a run.
        holders: dict[int, list[tuple[int, int]]] = {}
        for node, bid_sum in mine.items():
            up = tree.parent[node]
            if bid_sum and up != NO_PARENT:
                holders.setdefault(up, []).append((context.position[node], bid_sum))
        self._holders: dict[int, tuple[list[int], list[int]]] = {}
        for node, places in holders.items():
            places.sort()
            self._holders[node] = (
                [place for place, _ in places],
                [0, *accumulate(bid_sum for _, bid_sum in places)],
            )

    def numerator_without(self, zeroed: Collection[int]) -> int:
        """(n-1) times the user's payment with the bids of `zeroed` (the user's) set to 0."""
        if len(zeroed) == 1:
            (index,) = zeroed
            return self.numerator_without_one(index)
        return self.numerator + self._loss(zeroed)

    def numerator_without_one(self, index: int) -> int:
        """(n-1) times the user's payment with the bid of request `index` set to 0."""
        return self.numerator + self._single_loss(index)

    def _single_loss(self, index: int) -> int:
        """Phi(chosen; v) - Phi(chosen after zeroing one bid; v): one affected child a node."""
        bid = self._bids[index]
        if bid == 0:
            return 0
        context = self._context
        parent, count, bid_sum = context.parent, context.count, context.bid_sum
        mine = self._mine
        loss = 0
        child = context.leaf_of[index]
        node = parent[child]
        while node != NO_PARENT:
            order = context.ordered_children[node]
            if len(order) > 1:
                n_a, start = count[child], context.position[child] + 1
                end = self._overtaken_until(order, start, child, bid_sum[child] - bid)
                if end > start:
                    prefix_f, prefix_n = context.prefix_sums(node)
                    run_n = prefix_n[end] - prefix_n[start]
                    run_v = prefix_f[end] - prefix_f[start] - self._mine_between(node, start, end)
                    loss += run_n * (bid_sum[child] - mine[child]) - n_a * run_v
            child, node = node, parent[node]
        return loss

    def _loss(self, zeroed: Collection[int]) -> int:
        """Phi(chosen; v) - Phi(chosen after zeroing `zeroed`; v), for any set of the user's."""
        tree = self._context
        # drop[node] = the zeroed bids under the node; a child with a positive drop is affected.
        drop: dict[int, int] = {}
        for index in set(zeroed):
            bid = self._bids[index]
            node = tree.leaf_of[index]
            while bid and node != NO_PARENT:
                drop[node] = drop.get(node, 0) + bid
                node = tree.parent[node]
        affected: dict[int, list[int]] = {}
        for node in drop:
            up = tree.parent[node]
            if up != NO_PARENT:
                affected.setdefault(up, []).append(node)
        return sum(self._node_loss(node, kids, drop) for node, kids in affected.items())

    def _node_loss(self, node: int, affected: list[int], drop: dict[int, int]) -> int:
        context = self._context
        order = context.ordered_children[node]
        if len(order) < 2:
            return 0
        count, bid_sum, position, first = (
            context.count,
            context.bid_sum,
            context.position,
            context.first,
        )
        prefix_f, prefix_n = context.prefix_sums(node)
        affected.sort(key=position.__getitem__)
        places = [position[child] for child in affected]
        affected_f = [0, *accumulate(bid_sum[child] for child in affected)]
        affected_n = [0, *accumulate(count[child] for child in affected)]
        affected_mine = [0, *accumulate(self._mine[child] for child in affected)]
        others = [bid_sum[child] - self._mine[child] for child in affected]  # V of each

        loss = 0
        # Affected child against unaffected ones: a swaps with those of the run it now trails.
        for s, child in enumerate(affected):
            n_a, start = count[child], places[s] + 1
            end = self._overtaken_until(order, start, child, bid_sum[child] - drop[child])
            if end == start:
                continue
            last = bisect_left(places, end, lo=s + 1)  # affected children inside the run
            run_f = prefix_f[end] - prefix_f[start] - (affected_f[last] - affected_f[s + 1])
            run_n = prefix_n[end] - prefix_n[start] - (affected_n[last] - affected_n[s + 1])
            run_mine = self._mine_between(node, start, end) - (
                affected_mine[last] - affected_mine[s + 1]
            )
            loss += run_n * others[s] - n_a * (run_f - run_mine)

        # Affected children among themselves: served again by their lowered averages.
        if len(affected) > 1:
            slots = range(len(affected))
            after = sorted(
                slots,
                key=lambda s: AverageBidKey(
                    bid_sum[affected[s]] - drop[affected[s]], count[affected[s]], first[affected[s]]
                ),
            )
            loss += self._pair_sum(slots, affected, others) - self._pair_sum(
                after, affected, others
            )
        return loss

    def _overtaken_until(self, order: list[int], start: int, child: int, lowered: int) -> int:
        """The end of the run from `start` of children served before `child` once its bid sum
        is `lowered`: those with a higher average, or an equal one and an earlier arrival (the
        schedule's order). A binary search: the children are sorted by that same key."""
        context = self._context
        bid_sum, count, first = context.bid_sum, context.count, context.first
        n_a, first_a = count[child], first[child]
        low, high = start, len(order)
        while low < high:
            middle = (low + high) // 2
            other = order[middle]
            theirs, ours = bid_sum[other] * n_a, lowered * count[other]
            if theirs > ours or (theirs == ours and first[other] < first_a):
                low = middle + 1
            else:
                high = middle
        return low

    def _mine_between(self, node: int, start: int, end: int) -> int:
        """The user's bids under the node's children served at places [start, end)."""
        held = self._holders.get(node)
        if held is None:
            return 0
        places, prefix = held
        return prefix[bisect_left(places, end)] - prefix[bisect_left(places, start)]

    def _pair_sum(self, slots: Sequence[int], affected: list[int], values: list[int]) -> int:
        """sum_{j<k} N(c_k) * V(c_j) for the affected children served in the order `slots`."""
        total = 0
        before = 0
        for s in slots:
            total += self._context.count[affected[s]] * before
            before += values[s]
        return total
