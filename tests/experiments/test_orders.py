"""Order properties: bid-sort is sorted, dfs orders are DFS, batches are served in turn."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from inference_auctions.experiments.orders import ORDERS, batch_order, queue_order
from inference_auctions.experiments.workloads import Query, Workload, chains, mixshare, trees
from inference_auctions.server.auction import AuctionRequest, run_auction
from inference_auctions.server.auction.batch import NOT_A_REQUEST, build_radix_tree


def _workloads() -> list[Workload]:
    rng = np.random.default_rng(5)
    return [
        mixshare(50, 200, rng),
        chains(200, rng),
        trees("short", 200, rng),
        trees("long", 120, rng),
    ]


def _is_dfs(queries: list[Query], order: list[int]) -> bool:
    """Whether the leaves under every radix node are contiguous in `order`."""
    tree = build_radix_tree([q.tokens for q in queries])
    position = {request: place for place, request in enumerate(order)}
    leaves: list[list[int]] = [[] for _ in tree.parent]
    for node in reversed(tree.preorder):
        if tree.request[node] != NOT_A_REQUEST:
            leaves[node].append(position[tree.request[node]])
        parent = tree.parent[node]
        if parent >= 0:
            leaves[parent].extend(leaves[node])
    return all(max(spots) - min(spots) + 1 == len(spots) for spots in leaves if spots)


@pytest.mark.parametrize("workload", _workloads(), ids=lambda w: w.name)
def test_dfs_orders_are_dfs_and_flat_orders_are_not(workload: Workload) -> None:
    queries = list(workload.queries)
    for order in ORDERS:
        served = batch_order(order, queries)
        assert sorted(served) == list(range(len(queries)))
        if order.startswith("dfs"):
            assert _is_dfs(queries, served)
    # Shuffled arrival interleaves the groups, so ignoring the tree breaks it up.
    assert not _is_dfs(queries, batch_order("no-sort", queries))
    assert not _is_dfs(queries, batch_order("bid-sort", queries))


def test_bid_sort_is_sorted_with_ties_in_arrival_order() -> None:
    values = [5, 9, 5, 1, 9, 0]
    queries = [Query(np.array([i + 1]), v, i, 16) for i, v in enumerate(values)]
    assert batch_order("bid-sort", queries) == [1, 4, 0, 2, 3, 5]
    assert batch_order("no-sort", queries) == list(range(6))


def test_dfs_bid_is_the_auction_and_dfs_uniform_ignores_bids() -> None:
    queries = list(mixshare(50, 150, np.random.default_rng(1)).queries)
    requests = [
        AuctionRequest(str(i), f"group-{q.group}", q.tokens, q.value) for i, q in enumerate(queries)
    ]
    assert batch_order("dfs-bid", queries) == [int(r) for r in run_auction(requests).order]
    flat = [replace(q, value=7) for q in queries]
    assert batch_order("dfs-uniform", queries) == batch_order("dfs-uniform", flat)
    assert batch_order("dfs-bid", flat) == batch_order("dfs-uniform", queries)


def test_a_queue_is_ordered_batch_by_batch() -> None:
    queries = list(mixshare(50, 100, np.random.default_rng(2)).queries)
    for order in ORDERS:
        served = queue_order(order, queries, 32)
        for start in range(0, 100, 32):
            batch = served[start : start + 32]
            assert sorted(batch) == list(range(start, min(start + 32, 100)))
            assert [i - start for i in batch] == batch_order(order, queries[start : start + 32])
    with pytest.raises(ValueError, match="batch_size"):
        queue_order("no-sort", queries, 0)
    with pytest.raises(ValueError, match="unknown order"):
        batch_order("random", queries)
