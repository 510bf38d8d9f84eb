"""Exact VCG payments in quasilinear time (SPEC section 1, "Fast payments").

With Phi = (n-1) * W, Phi splits over the tree's nodes: a node whose children are served in the
order c_1..c_d contributes sum_{j<k} N(c_k) * F(c_j). Zeroing user i's bids lowers F only on the
paths from the root to i's leaves, so (n-1) * p_i is a sum, over those nodes, of the best
order's contribution minus the chosen order's contribution under the reduced sums G.

At such a node the unaffected children keep their relative order. An affected child a (its sum
drops from F(a) to G(a)) can only move later: it is overtaken exactly by the unaffected children
after it whose average exceeds G(a)/N(a), a contiguous run of the sorted children found by binary
search, and each overtaking pair (a, k) gains N(a)*F(k) - N(k)*G(a). The affected children among
themselves are re-sorted by G/N, and their gain is the difference of two pair sums.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence
from itertools import accumulate

from inference_auctions.server.auction.schedule import AverageBidKey, Schedule
from inference_auctions.server.auction.tree import NO_PARENT, RadixTree


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

    Built once per batch; repricing (`marginals.ZeroedCharges`) reads the same fields.
    """

    def __init__(self, tree: RadixTree, schedule: Schedule) -> None:
        self.tree = tree
        self.ordered_children = schedule.ordered_children
        self.count = schedule.sums.count
        self.bid_sum = schedule.sums.bid_sum
        self.first = schedule.sums.first
        self.order = schedule.order
        self.position = [0] * len(tree.parent)
        for kids in schedule.ordered_children:
            for place, child in enumerate(kids):
                self.position[child] = place
        self.rank = [0] * len(tree.parent)
        for place, node in enumerate(tree.preorder):
            self.rank[node] = place
        self._prefixes: dict[int, tuple[list[int], list[int]]] = {}

    def numerators(self, bids: Sequence[int], users: Sequence[str]) -> dict[str, int]:
        """(n-1) * p_i for every user of a batch of two or more requests."""
        by_user: dict[str, list[int]] = {}
        for index, user in enumerate(users):
            by_user.setdefault(user, []).append(index)
        return {user: self.user_numerator(requests, bids) for user, requests in by_user.items()}

    def user_numerator(self, requests: list[int], bids: Sequence[int]) -> int:
        """(n-1) times the payment of the user who sent `requests`."""
        parent = self.tree.parent
        # drop[u] = the user's bids under u, i.e. F(u) - G(u); only nodes with a positive drop
        # change, so the walk up from each leaf stops at the first node already reached.
        drop: dict[int, int] = {}
        for index in requests:
            if bids[index] == 0:
                continue
            leaf = self.tree.leaf_of[index]
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
