"""The experiment runner applies the server's deferral rule: a batch of siblings, served."""

from __future__ import annotations

import numpy as np

from inference_auctions.experiments.orders import ScheduledBatch, queue_batches
from inference_auctions.experiments.runner import Engine, serve
from inference_auctions.experiments.workloads import Query
from inference_auctions.server.serving.deferral import DeferralSettings

PREFIX = list(range(1, 401))


def _siblings(count: int) -> list[Query]:
    return [
        Query(tokens=np.array([*PREFIX, 1000 + i]), value=count - i, group=0, max_new_tokens=8)
        for i in range(count)
    ]


def _served(engine: Engine) -> tuple[list[int], list[float], int]:
    queries = _siblings(5)
    batches = queue_batches("dfs-bid", queries, len(queries))
    order = [index for batch in batches for index in batch.indexes]
    served = serve(queries, order, engine, batches)
    return [served.cached_tokens[i] for i in order], [served.ttfts[i] for i in order], served.held


def test_siblings_compute_their_prefix_once_with_the_rule_and_once_each_without() -> None:
    cached, ttfts, held = _served(Engine())
    assert cached == [0] + [len(PREFIX)] * 4
    assert held == 4
    assert ttfts == sorted(ttfts) and ttfts[0] < ttfts[1]
    cached, ttfts, held = _served(Engine(deferral=None))
    assert cached == [0] * 5  # one prefill step admitted them all
    assert held == 0
    assert len(set(ttfts)) == 1


def test_a_short_hold_runs_out_on_the_simulated_clock() -> None:
    _, released_on_first_token, _ = _served(Engine())
    # Held for 1 ms, the siblings reach the engine while the first one's prefill still runs:
    # they join the very next step. Released by its first token, they reach it only after the
    # engine began its next step (a decode step), as over HTTP.
    cached, ttfts, held = _served(Engine(deferral=DeferralSettings(max_hold_seconds=0.001)))
    assert held == 4
    assert cached == [0] + [len(PREFIX)] * 4
    assert ttfts[0] == released_on_first_token[0]
    assert all(a < b for a, b in zip(ttfts[1:], released_on_first_token[1:], strict=True))


def test_the_flat_orders_are_never_deferred() -> None:
    queries = _siblings(5)
    batches = queue_batches("no-sort", queries, len(queries))
    assert batches == [ScheduledBatch(list(range(5)), None)]
    served = serve(queries, list(range(5)), Engine(), batches)
    assert served.held == 0 and served.cached_tokens == [0] * 5
