"""Serve a queue on the emulated engine, on its simulated clock, and measure every order.

The engine is the server's own `EngineSimulator` (radix cache, cost model, SGLang's FCFS
priority scheduling with continuous batching), started empty for every queue. The whole queue
is waiting at time 0, as on the paper's saturated server; each query is submitted with
priority = its place in the service order, which is how the server hands a cleared batch to
SGLang, so the engine admits them in exactly that order and a later batch never overtakes an
earlier one. The cache is never flushed between batches.

The server's in-step prefix deferral rule (`server.serving.deferral`, on unless `Engine.deferral` is
None) applies to the auction's orders exactly as the server applies it: a query it holds back
reaches the engine, with its place as priority, when the query it waits for produces its first
token or its hold runs out on the simulated clock. The engine itself models SGLang as it is.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from inference_auctions.experiments.metrics import (
    realized_priorities,
    welfare,
    welfare_gain_percent,
)
from inference_auctions.experiments.orders import ScheduledBatch, queue_batches
from inference_auctions.experiments.plan import Sweep, WorkloadSpec
from inference_auctions.experiments.workloads import Query, Workload
from inference_auctions.server.auction.batch import build_radix_tree
from inference_auctions.server.emulator.cost_model import CostModel
from inference_auctions.server.emulator.simulator import (
    DEFAULT_CACHE_TOKENS,
    DEFAULT_CHUNKED_PREFILL_SIZE,
    EngineSimulator,
    SimRequest,
)
from inference_auctions.server.serving.deferral import DeferralSettings, PrefixDeferral

__all__ = ["Engine", "Measurement", "Served", "SweepResult", "measure", "run_sweep", "serve"]


@dataclass(frozen=True, slots=True)
class Engine:
    """The emulated server: KV cache, cost model, prefill budget, deferral rule (None: off)."""

    cache_tokens: int = DEFAULT_CACHE_TOKENS
    cost_model: CostModel = field(default_factory=CostModel)
    chunked_prefill_size: int = DEFAULT_CHUNKED_PREFILL_SIZE
    deferral: DeferralSettings | None = field(default_factory=DeferralSettings)


@dataclass(frozen=True, slots=True)
class Served:
    """What the engine did with a queue: per query (arrival order) TTFT and cached tokens.

    `held` counts the queries the deferral rule held back, `held_seconds` their total wait.
    """

    ttfts: list[float]
    cached_tokens: list[int]
    hit_rate: float
    evicted_tokens: int
    held: int = 0
    held_seconds: float = 0.0


@dataclass(frozen=True, slots=True)
class Measurement:
    """One order on one queue: welfare (micro-credits and % above half), hit rate, TTFT.

    `drain` is when the last query got its first token (the total prefill work, whatever the
    order), `evicted_tokens` what the cache dropped to make room, `value_weighted_ttft` the mean
    TTFT weighted by each query's value (its truthful bid), and `held` the queries the deferral
    rule held back.
    """

    welfare: float
    welfare_percent: float
    hit_rate: float
    mean_ttft: float
    drain: float
    evicted_tokens: int
    value_weighted_ttft: float = 0.0
    held: int = 0


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


def serve(
    queries: Sequence[Query],
    order: Sequence[int],
    engine: Engine,
    batches: Sequence[ScheduledBatch] | None = None,
) -> Served:
    """Run the queue through a fresh engine simulator with `order` as its priorities.

    With `batches` (the same order, cut into the auction's batches) and `engine.deferral`, the
    deferral rule decides when each query of a batch with radix paths reaches the engine.
    """
    simulator = EngineSimulator(
        cache_tokens=engine.cache_tokens,
        cost_model=engine.cost_model,
        chunked_prefill_size=engine.chunked_prefill_size,
    )
    rank = {index: place for place, index in enumerate(order)}

    def submit(indexes: Sequence[int], now: float) -> None:
        for index in indexes:
            query = queries[index]
            # Plain ints: the engine keys its radix cache on them.
            tokens = query.tokens.tolist()
            simulator.submit(
                SimRequest(
                    str(index), tokens, query.max_new_tokens, priority=rank[index], arrival=now
                )
            )

    held, held_seconds = 0, 0.0
    deferred = batches is not None and any(batch.prefixes is not None for batch in batches)
    if engine.deferral is None or batches is None or not deferred:
        submit(order, 0.0)
        simulator.run()
    else:
        if [index for batch in batches for index in batch.indexes] != list(order):
            raise ValueError("batches must list the queries of order, in that order")
        rule: PrefixDeferral[int] = PrefixDeferral(engine.deferral)
        for batch in batches:
            if batch.prefixes is None:
                submit(batch.indexes, 0.0)
            else:
                sent = rule.add_batch(batch.prefixes, batch.indexes, 0.0)
                held += len(batch.indexes) - len(sent)
                submit(sent, 0.0)
        held_seconds = _run_deferred(simulator, rule, submit)
    outcomes = [simulator.outcome(str(index)) for index in range(len(queries))]
    # The whole queue waits from time 0, whenever the rule let a query reach the engine.
    ttfts = [outcome.first_token_at for outcome in outcomes]
    if any(ttft is None for ttft in ttfts):
        raise RuntimeError("the engine finished with queries that never got a first token")
    return Served(
        ttfts=[float(ttft or 0.0) for ttft in ttfts],
        cached_tokens=[outcome.cached_tokens for outcome in outcomes],
        hit_rate=simulator.stats.cache_hit_rate,
        evicted_tokens=simulator.cache.stats.evicted_tokens,
        held=held,
        held_seconds=held_seconds,
    )


def _run_deferred(
    simulator: EngineSimulator,
    rule: PrefixDeferral[int],
    submit: Callable[[Sequence[int], float], None],
) -> float:
    """Run to the end, step by step, releasing held queries as the server would; total hold."""
    held_seconds = 0.0
    while True:
        times = [t for t in (simulator.next_event_time(), rule.next_deadline()) if t is not None]
        if not times:
            break
        until = min(times)
        released = []
        for step in simulator.advance_to(until):
            if step.kind == "prefill":
                # A query whose output is empty finishes in its prefill without a token.
                for rid in dict.fromkeys((*step.rids, *step.finished)):
                    released += rule.first_token(int(rid), step.end)
        released += rule.expire(until)
        held_seconds += sum(release.held_seconds for release in released)
        # The engine has already begun its next step: released queries join the one after,
        # as a request sent when a first token streams out reaches SGLang.
        submit([release.key for release in released], simulator.now)
    if rule.holding:
        raise RuntimeError("the deferral rule still holds queries after the engine finished")
    return held_seconds


def measure(workload: Workload, order: str, batch_size: int, engine: Engine) -> Measurement:
    """Order the queue in batches of `batch_size`, serve it, and measure the result."""
    batches = queue_batches(order, workload.queries, batch_size)
    served_order = [index for batch in batches for index in batch.indexes]
    served = serve(workload.queries, served_order, engine, batches)
    priorities = realized_priorities(served.ttfts)
    values = workload.values
    return Measurement(
        welfare=welfare(values, priorities),
        welfare_percent=welfare_gain_percent(values, priorities),
        hit_rate=served.hit_rate,
        mean_ttft=float(np.mean(served.ttfts)),
        drain=max(served.ttfts),
        evicted_tokens=served.evicted_tokens,
        value_weighted_ttft=float(np.average(served.ttfts, weights=values))
        if sum(values)
        else float(np.mean(served.ttfts)),
        held=served.held,
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
