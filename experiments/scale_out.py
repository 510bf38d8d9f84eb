"""Scale-out on the simulated clock: K emulated workers, each with its own auction, behind a
bid-blind router, serving the paper's saturated queue.

The queue (mixshare, half of it in shared-prefix clusters) arrives all at once. A router
model assigns each query, in arrival order, to one of K workers without looking at its bid:

* `prefix-aware`, a model of SMG's `cache_aware` policy: each worker remembers the prompts
  routed to it (in 16-token blocks, as a prefix index); a query goes to the worker holding
  its longest prefix when that covers at least `CACHE_THRESHOLD` of the prompt and that
  worker is not overloaded (SMG's spill gate: above the mean load by a margin and by
  `SPILL_RELATIVE`), otherwise to the least loaded worker;
* `round-robin`: query i to worker i mod K.

Each worker then auctions its own share of the queue in batches, exactly as one server does
(`inference_auctions.experiments.orders`), and serves it on its own fresh engine simulator with
its own KV cache. Welfare ranks every query of the deployment by its time to first token, as the
paper ranks one server's queries; the hit rate is cached over prompt tokens of all workers.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from inference_auctions.experiments.metrics import (
    mean_and_stderr,
    realized_priorities,
    welfare_gain_percent,
)
from inference_auctions.experiments.orders import queue_batches
from inference_auctions.experiments.runner import Engine, serve
from inference_auctions.experiments.workloads import OUTPUT_TOKENS, Query, Workload, mixshare

__all__ = [
    "ORDERS",
    "ROUTERS",
    "WORKER_COUNTS",
    "ScaleOutPoint",
    "ScaleOutResult",
    "route",
    "run_scale_out",
]

WORKER_COUNTS = (1, 2, 4, 8)
ROUTERS = ("prefix-aware", "round-robin")
ORDERS = ("dfs-bid", "dfs-uniform", "bid-sort")
SHARE = 50.0  # percent of the queries in shared-prefix clusters
BATCH = 64  # the server's default batch size
# SMG's defaults for cache_aware.
CACHE_THRESHOLD = 0.3
SPILL_ABSOLUTE = 64
SPILL_RELATIVE = 1.5
BLOCK_TOKENS = 16


def _block_keys(tokens: Sequence[int]) -> list[int]:
    """A key per whole 16-token block, each also naming every block before it."""
    keys: list[int] = []
    key = 0
    for start in range(0, len(tokens) - BLOCK_TOKENS + 1, BLOCK_TOKENS):
        key = hash((key, tuple(tokens[start : start + BLOCK_TOKENS])))
        keys.append(key)
    return keys


def _matched_blocks(keys: Sequence[int], index: set[int]) -> int:
    matched = 0
    for key in keys:
        if key not in index:
            break
        matched += 1
    return matched


def route(queries: Sequence[Query], workers: int, router: str) -> list[int]:
    """The worker of each query, in arrival order; never reads a bid."""
    if router == "round-robin":
        return [i % workers for i in range(len(queries))]
    if router != "prefix-aware":
        raise ValueError(f"unknown router {router!r}; choose from {', '.join(ROUTERS)}")
    indexes: list[set[int]] = [set() for _ in range(workers)]
    loads = [0] * workers
    chosen: list[int] = []
    for query in queries:
        tokens = query.tokens.tolist()
        keys = _block_keys(tokens)
        matches = [_matched_blocks(keys, index) for index in indexes]
        best = max(range(workers), key=lambda w: (matches[w], -loads[w]))
        share = matches[best] * BLOCK_TOKENS / max(len(tokens), 1)
        mean = sum(loads) / workers
        # SMG's spill gate: a margin of SMG's absolute threshold, capped at two standard
        # deviations of a Poisson load at this mean (never under four).
        margin = min(SPILL_ABSOLUTE, max(4.0, 2 * math.sqrt(mean)))
        overloaded = loads[best] > mean + margin and loads[best] > SPILL_RELATIVE * mean
        if share < CACHE_THRESHOLD or overloaded:
            best = min(range(workers), key=lambda w: (loads[w], w))
        chosen.append(best)
        loads[best] += 1
        indexes[best].update(keys)
    return chosen


@dataclass(frozen=True, slots=True)
class ScaleOutPoint:
    """One order, router and worker count on one queue."""

    welfare_percent: float
    hit_rate: float
    mean_ttft: float
    busiest_share: float  # the largest worker's part of the queue


def measure_deployment(
    workload: Workload, workers: int, router: str, order: str, engine: Engine
) -> ScaleOutPoint:
    """Route the queue, auction and serve each worker's part, and measure the whole."""
    assignment = route(workload.queries, workers, router)
    ttfts = [0.0] * len(workload.queries)
    cached = 0
    for worker in range(workers):
        mine = [i for i, w in enumerate(assignment) if w == worker]
        if not mine:
            continue
        queries = [workload.queries[i] for i in mine]
        # Each worker's server clears its own batches and applies its own deferral rule.
        batches = queue_batches(order, queries, BATCH)
        served_order = [index for batch in batches for index in batch.indexes]
        served = serve(queries, served_order, engine, batches)
        for local, index in enumerate(mine):
            ttfts[index] = served.ttfts[local]
        cached += sum(served.cached_tokens)
    prompt = sum(len(query.tokens) for query in workload.queries)
    values = workload.values
    priorities = realized_priorities(ttfts)
    return ScaleOutPoint(
        welfare_percent=welfare_gain_percent(values, priorities),
        hit_rate=cached / prompt,
        mean_ttft=float(np.mean(ttfts)),
        busiest_share=max(assignment.count(w) for w in range(workers)) / len(assignment),
    )


@dataclass(slots=True)
class ScaleOutResult:
    """`points[router][order][K]`: one `ScaleOutPoint` per trial."""

    queue: int
    trials: int
    points: dict[str, dict[str, dict[int, list[ScaleOutPoint]]]] = field(default_factory=dict)

    def mean(self, router: str, order: str, workers: int, metric: str) -> tuple[float, float]:
        """Mean and standard error of `metric` over the trials."""
        return mean_and_stderr([getattr(p, metric) for p in self.points[router][order][workers]])

    def as_json(self) -> dict[str, object]:
        """Every trial's numbers, for results.json."""
        return {
            "queue": self.queue,
            "trials": self.trials,
            "share_percent": SHARE,
            "batch": BATCH,
            "points": {
                router: {
                    order: {str(k): [vars_of(p) for p in trials] for k, trials in by_k.items()}
                    for order, by_k in by_order.items()
                }
                for router, by_order in self.points.items()
            },
        }


def vars_of(point: ScaleOutPoint) -> dict[str, float]:
    """A point as a plain dict."""
    return {
        "welfare_percent": point.welfare_percent,
        "hit_rate": point.hit_rate,
        "mean_ttft": point.mean_ttft,
        "busiest_share": point.busiest_share,
    }


def run_scale_out(
    *,
    queue: int,
    trials: int,
    seed: int,
    orders: Sequence[str] = ORDERS,
    worker_counts: Sequence[int] = WORKER_COUNTS,
    outputs: tuple[int, int] = OUTPUT_TOKENS,
    engine: Engine | None = None,
    advance: Callable[[], None] | None = None,
) -> ScaleOutResult:
    """Every router, order and K on `trials` queues; `advance` ticks once per queue and K."""
    engine = engine or Engine()
    result = ScaleOutResult(queue=queue, trials=trials)
    for router in ROUTERS:
        result.points[router] = {order: {k: [] for k in worker_counts} for order in orders}
    for trial in range(trials):
        rng = np.random.default_rng([seed, trial, 16])
        workload = mixshare(SHARE, queue, rng, outputs=outputs)
        for k in worker_counts:
            for order in orders:
                for router in ROUTERS:
                    if k == 1 and router != ROUTERS[0]:
                        point = result.points[ROUTERS[0]][order][k][-1]  # one worker: no routing
                    else:
                        point = measure_deployment(workload, k, router, order, engine)
                    result.points[router][order][k].append(point)
            if advance is not None:
                advance()
    return result
