"""The four service orders the paper compares, applied batch by batch to a saturated queue.

* `dfs-bid`: this project's auction (average-bid DFS with VCG payments) on truthful bids.
* `dfs-uniform`: the same auction with every bid equal: a DFS of the radix tree in arrival
  order, SGLang's longest-prefix-match order.
* `bid-sort`: by decreasing bid, ignoring the prefix tree (ties in arrival order).
* `no-sort`: arrival order.

The queue is cut into consecutive batches of `n` in arrival order; each batch is ordered on
its own and the batches are served one after another. The auction's orders also keep the
radix paths of their batches (`server.serving.deferral.BatchPrefixes`), which the runner hands to
the server's in-step prefix deferral rule, as the server does with every batch it clears.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from inference_auctions.experiments.workloads import Query
from inference_auctions.server.auction import AuctionRequest, run_auction
from inference_auctions.server.serving.deferral import BatchPrefixes

__all__ = ["ORDERS", "ScheduledBatch", "batch_order", "queue_batches", "queue_order"]

ORDERS = ("dfs-bid", "dfs-uniform", "bid-sort", "no-sort")


@dataclass(frozen=True, slots=True)
class ScheduledBatch:
    """One ordered batch: query indexes in service order, and the auction's radix paths.

    `prefixes` is None for the orders that do not come from the auction (bid-sort, no-sort).
    """

    indexes: list[int]
    prefixes: BatchPrefixes | None


def batch_schedule(order: str, queries: Sequence[Query]) -> ScheduledBatch:
    """One batch under `order`, as indexes into `queries`."""
    if order == "dfs-bid":
        return _auction(queries, [query.value for query in queries])
    if order == "dfs-uniform":
        return _auction(queries, [1] * len(queries))
    if order == "bid-sort":
        # sorted is stable, so equal bids keep their arrival order.
        return ScheduledBatch(sorted(range(len(queries)), key=lambda i: -queries[i].value), None)
    if order == "no-sort":
        return ScheduledBatch(list(range(len(queries))), None)
    raise ValueError(f"unknown order {order!r}; choose from {', '.join(ORDERS)}")


def batch_order(order: str, queries: Sequence[Query]) -> list[int]:
    """Service order of one batch under `order`, as indexes into `queries`."""
    return batch_schedule(order, queries).indexes


def queue_batches(order: str, queries: Sequence[Query], batch_size: int) -> list[ScheduledBatch]:
    """The whole queue in batches of `batch_size`, each ordered, indexes into `queries`."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    batches: list[ScheduledBatch] = []
    for start in range(0, len(queries), batch_size):
        batch = batch_schedule(order, queries[start : start + batch_size])
        batches.append(ScheduledBatch([start + i for i in batch.indexes], batch.prefixes))
    return batches


def queue_order(order: str, queries: Sequence[Query], batch_size: int) -> list[int]:
    """Service order of the whole queue: each batch of `batch_size` ordered, batches in turn."""
    return [index for batch in queue_batches(order, queries, batch_size) for index in batch.indexes]


def _auction(queries: Sequence[Query], bids: Sequence[int]) -> ScheduledBatch:
    requests = [
        AuctionRequest(rid=str(index), user=f"group-{query.group}", tokens=query.tokens, bid=bid)
        for index, (query, bid) in enumerate(zip(queries, bids, strict=True))
    ]
    outcome = run_auction(requests)
    return ScheduledBatch([int(rid) for rid in outcome.order], BatchPrefixes.from_outcome(outcome))
