"""The average-bid DFS: the welfare-maximizing depth-first schedule of a batch (SPEC section 1).

At every node the children (radix nodes and request leaves alike) are visited in decreasing
order of their average bid F/N, compared exactly as F1*N2 vs F2*N1. Ties go to the child whose
earliest request arrived first, so all-equal bids give a deterministic DFS in arrival order.
"""

from __future__ import annotations

from dataclasses import dataclass

from inference_auctions.server.auction.batch import NO_PARENT, NOT_A_REQUEST, ROOT, RadixTree


@dataclass(frozen=True, slots=True)
class SubtreeSums:
    """Per node: N = request leaves under it, F = sum of their bids, first = earliest arrival."""

    count: list[int]
    bid_sum: list[int]
    first: list[int]


@dataclass(frozen=True, slots=True)
class Schedule:
    """The chosen DFS: request indexes in service order and every node's ordered children."""

    order: list[int]
    ordered_children: list[list[int]]
    sums: SubtreeSums


class AverageBidKey:
    """Sort key: higher average bid first, exactly; then earlier arrival."""

    __slots__ = ("bid_sum", "count", "first")

    def __init__(self, bid_sum: int, count: int, first: int) -> None:
        self.bid_sum = bid_sum
        self.count = count
        self.first = first

    def __lt__(self, other: AverageBidKey) -> bool:
        mine = self.bid_sum * other.count
        theirs = other.bid_sum * self.count
        if mine != theirs:
            return mine > theirs
        return self.first < other.first


def subtree_sums(tree: RadixTree, bids: list[int]) -> SubtreeSums:
    """Aggregate N, F and the earliest arrival of every subtree, children before parents."""
    size = len(tree.parent)
    count = [0] * size
    bid_sum = [0] * size
    first = [len(bids)] * size
    for node in reversed(tree.preorder):
        index = tree.request[node]
        if index != NOT_A_REQUEST:
            count[node] = 1
            bid_sum[node] = bids[index]
            first[node] = index
        up = tree.parent[node]
        if up != NO_PARENT:
            count[up] += count[node]
            bid_sum[up] += bid_sum[node]
            first[up] = min(first[up], first[node])
    return SubtreeSums(count=count, bid_sum=bid_sum, first=first)


def average_bid_dfs(tree: RadixTree, bids: list[int]) -> Schedule:
    """Order the batch by the average-bid DFS."""
    sums = subtree_sums(tree, bids)
    keys = [
        AverageBidKey(f, n, a) for f, n, a in zip(sums.bid_sum, sums.count, sums.first, strict=True)
    ]
    ordered_children = [
        sorted(kids, key=keys.__getitem__) if len(kids) > 1 else kids for kids in tree.children
    ]
    order: list[int] = []
    pending = [ROOT]
    while pending:
        node = pending.pop()
        index = tree.request[node]
        if index != NOT_A_REQUEST:
            order.append(index)
        else:
            pending.extend(reversed(ordered_children[node]))
    return Schedule(order=order, ordered_children=ordered_children, sums=sums)
