"""Serve a queue on the emulated engine, on its simulated clock, and measure every order.

The engine is the server's own `EngineSimulator` (radix cache, cost model, SGLang's FCFS
priority scheduling with continuous batching), started empty for every queue. The whole queue
is waiting at time 0, as on the paper's saturated server; each query is submitted with
priority = its place in the service order, which is how the server hands a cleared batch to
SGLang, so the engine admits them in exactly that order and a later batch never overtakes an
earlier one. The cache is never flushed between batches.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from bench.experiments.metrics import realized_priorities, welfare, welfare_gain_percent
from bench.experiments.orders import queue_order
from bench.experiments.plan import Sweep, WorkloadSpec
from bench.experiments.workloads import Query, Workload
from server.auction.tree import build_radix_tree
from server.engine.cost_model import CostModel
from server.engine.simulator import (
    DEFAULT_CACHE_TOKENS,
    DEFAULT_CHUNKED_PREFILL_SIZE,
    EngineSimulator,
    SimRequest,
)

__all__ = ["Engine", "Measurement", "Served", "SweepResult", "measure", "run_sweep", "serve"]


@dataclass(frozen=True, slots=True)
class Engine:
    """The emulated server: KV cache size in tokens, cost model, prefill tokens per step."""

    cache_tokens: int = DEFAULT_CACHE_TOKENS
    cost_model: CostModel = field(default_factory=CostModel)
    chunked_prefill_size: int = DEFAULT_CHUNKED_PREFILL_SIZE


@dataclass(frozen=True, slots=True)
class Served:
    """What the engine did with a queue: per query (arrival order) TTFT and cached tokens."""

    ttfts: list[float]
    cached_tokens: list[int]
    hit_rate: float
    evicted_tokens: int


@dataclass(frozen=True, slots=True)
class Measurement:
    """One order on one queue: welfare (micro-credits and % above half), hit rate, TTFT.

    `drain` is when the last query got its first token (the total prefill work, whatever the
    order), and `evicted_tokens` what the cache dropped to make room.
    """

    welfare: float
    welfare_percent: float
    hit_rate: float
    mean_ttft: float
    drain: float
    evicted_tokens: int


@dataclass(frozen=True, slots=True)
class WorkloadStats:
    """Shape of a queue: mean prompt tokens, tokens a cache could reuse, distinct tokens."""

    mean_prompt_tokens: float
    shared_percent: float
    unique_tokens: int


@dataclass(slots=True)
class SweepResult:
    """Every measurement of a sweep: `measurements[order][point][trial]`."""

    sweep: Sweep
    measurements: dict[str, list[list[Measurement]]]
    workloads: list[list[WorkloadStats]]


def serve(queries: Sequence[Query], order: Sequence[int], engine: Engine) -> Served:
    """Run the queue through a fresh engine simulator with `order` as its priorities."""
    simulator = EngineSimulator(
        cache_tokens=engine.cache_tokens,
        cost_model=engine.cost_model,
        chunked_prefill_size=engine.chunked_prefill_size,
    )
    for rank, index in enumerate(order):
        query = queries[index]
        # Plain ints: the engine keys its radix cache on them.
        tokens = query.tokens.tolist()
        simulator.submit(SimRequest(str(index), tokens, query.max_new_tokens, priority=rank))
    simulator.run()
    outcomes = [simulator.outcome(str(index)) for index in range(len(queries))]
    ttfts = [outcome.ttft for outcome in outcomes]
    if any(ttft is None for ttft in ttfts):
        raise RuntimeError("the engine finished with queries that never got a first token")
    return Served(
        ttfts=[float(ttft or 0.0) for ttft in ttfts],
        cached_tokens=[outcome.cached_tokens for outcome in outcomes],
        hit_rate=simulator.stats.cache_hit_rate,
        evicted_tokens=simulator.cache.stats.evicted_tokens,
    )


def measure(workload: Workload, order: str, batch_size: int, engine: Engine) -> Measurement:
    """Order the queue in batches of `batch_size`, serve it, and measure the result."""
    served = serve(workload.queries, queue_order(order, workload.queries, batch_size), engine)
    priorities = realized_priorities(served.ttfts)
    values = workload.values
    return Measurement(
        welfare=welfare(values, priorities),
        welfare_percent=welfare_gain_percent(values, priorities),
        hit_rate=served.hit_rate,
        mean_ttft=float(np.mean(served.ttfts)),
        drain=max(served.ttfts),
        evicted_tokens=served.evicted_tokens,
    )


def workload_stats(workload: Workload) -> WorkloadStats:
    """Token counts of a queue, from its radix tree."""
    stats = build_radix_tree([query.tokens for query in workload.queries]).stats
    return WorkloadStats(
        mean_prompt_tokens=stats.total_tokens / max(stats.requests, 1),
        shared_percent=100.0 * stats.shared_tokens / max(stats.total_tokens, 1),
        unique_tokens=stats.unique_tokens,
    )


def run_sweep(
    sweep: Sweep,
    orders: Sequence[str],
    *,
    trials: int,
    seed: int,
    engine: Engine | None = None,
    advance: Callable[[], None] | None = None,
) -> SweepResult:
    """Measure every order at every point of `sweep`, `trials` times; `advance` ticks per point."""
    engine = engine or Engine()
    measurements: dict[str, list[list[Measurement]]] = {
        order: [[] for _ in sweep.points] for order in orders
    }
    shapes: list[list[WorkloadStats]] = [[] for _ in sweep.points]
    for trial in range(trials):
        # Points that share a workload spec (a batch-size sweep) serve the very same queue.
        made: dict[WorkloadSpec, tuple[Workload, WorkloadStats]] = {}
        for index, point in enumerate(sweep.points):
            if point.workload not in made:
                workload = point.workload.make(sweep.queue, seed, trial)
                made[point.workload] = workload, workload_stats(workload)
            workload, stats = made[point.workload]
            shapes[index].append(stats)
            for order in orders:
                measurements[order][index].append(measure(workload, order, point.batch, engine))
            if advance is not None:
                advance()
    return SweepResult(sweep, measurements, shapes)
