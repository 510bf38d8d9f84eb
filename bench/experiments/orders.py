"""The four service orders the paper compares, applied batch by batch to a saturated queue.

* `dfs-bid`: this project's auction (average-bid DFS with VCG payments) on truthful bids.
* `dfs-uniform`: the same auction with every bid equal: a DFS of the radix tree in arrival
  order, SGLang's longest-prefix-match order.
* `bid-sort`: by decreasing bid, ignoring the prefix tree (ties in arrival order).
* `no-sort`: arrival order.

The queue is cut into consecutive batches of `n` in arrival order; each batch is ordered on
its own and the batches are served one after another.
"""

from __future__ import annotations

from collections.abc import Sequence

from bench.experiments.workloads import Query
from server.auction import AuctionRequest, run_auction

__all__ = ["ORDERS", "batch_order", "queue_order"]

ORDERS = ("dfs-bid", "dfs-uniform", "bid-sort", "no-sort")


def batch_order(order: str, queries: Sequence[Query]) -> list[int]:
    """Service order of one batch under `order`, as indexes into `queries`."""
    if order == "dfs-bid":
        return _auction(queries, [query.value for query in queries])
    if order == "dfs-uniform":
        return _auction(queries, [1] * len(queries))
    if order == "bid-sort":
        # sorted is stable, so equal bids keep their arrival order.
        return sorted(range(len(queries)), key=lambda i: -queries[i].value)
    if order == "no-sort":
        return list(range(len(queries)))
    raise ValueError(f"unknown order {order!r}; choose from {', '.join(ORDERS)}")


def queue_order(order: str, queries: Sequence[Query], batch_size: int) -> list[int]:
    """Service order of the whole queue: each batch of `batch_size` ordered, batches in turn."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    served: list[int] = []
    for start in range(0, len(queries), batch_size):
        batch = queries[start : start + batch_size]
        served.extend(start + index for index in batch_order(order, batch))
    return served


def _auction(queries: Sequence[Query], bids: Sequence[int]) -> list[int]:
    requests = [
        AuctionRequest(rid=str(index), user=f"group-{query.group}", tokens=query.tokens, bid=bid)
        for index, (query, bid) in enumerate(zip(queries, bids, strict=True))
    ]
    return [int(rid) for rid in run_auction(requests).order]
