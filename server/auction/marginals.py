"""A user's VCG charge with some of the user's own bids zeroed, without re-solving the batch.

The failure refund and the per-request shares (SPEC section 1) both need c(Z): the user's
charge with the bids of Z, a set of the user's requests, set to 0. Re-solving the batch for
every Z costs a whole schedule and payment each time; this module prices Z from the schedule
already chosen, touching only the nodes above Z's leaves.

With Phi(order; v) = sum over requests of v * (requests served after it) = (n-1) * W, the user
u pays (n-1) * p_u = max Phi(.; v) - Phi(chosen; v), where v are the bids with all of u's
zeroed. Zeroing more of u's own bids leaves v as it is, so the first term does not move, and

    (n-1) * p_u(Z) = (n-1) * p_u + Phi(chosen; v) - Phi(chosen after Z; v).

Phi splits over the nodes: a node whose children are served c_1..c_d adds
sum_{j<k} N(c_k) * V(c_j), V(c) = the sum of v under c. Zeroing Z lowers F only on the paths
from the root to Z's leaves, so only the children orders of the nodes on them change, and there
only the children above a zeroed bid (the affected ones) move, each to a later place: past the
run of children after it that its lowered average no longer beats (a binary search in the
sorted children, with the schedule's own tie rule, earliest arrival first). Each pair (a, k)
that swaps changes Phi by N(a) * V(k) - N(k) * V(a); the affected children among themselves
are sorted again, and their part is the difference of two pair sums. For one request that is
one binary search per node on its path: O(depth * log(branching)) instead of a re-solve.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Collection, Sequence
from itertools import accumulate

from inference_auctions.server.auction.payments import PaymentContext
from inference_auctions.server.auction.schedule import AverageBidKey
from inference_auctions.server.auction.tree import NO_PARENT


class ZeroedCharges:
    """One user's charge numerator with any subset of the user's requests' bids zeroed."""

    def __init__(
        self, context: PaymentContext, bids: Sequence[int], requests: list[int], numerator: int
    ) -> None:
        """`requests`: the user's request indexes; `numerator`: (n-1) times the user's payment."""
        self._context = context
        self._bids = bids
        self.numerator = numerator
        tree = context.tree
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
        parent, count, bid_sum = context.tree.parent, context.count, context.bid_sum
        mine = self._mine
        loss = 0
        child = context.tree.leaf_of[index]
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
        context = self._context
        tree = context.tree
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
