"""The paper's qualitative results on a reduced setting (Q = 512), served by the emulated engine.

Every measurement here drives the server's own `EngineSimulator` on its simulated clock.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
import pytest

from inference_auctions.experiments.autobidding import (
    AutobidSettings,
    condition_number,
    run_autobidding,
)
from inference_auctions.experiments.orders import ORDERS, queue_order
from inference_auctions.experiments.plan import WorkloadSpec
from inference_auctions.experiments.runner import Engine, Measurement, measure, serve

QUEUE = 512
TRIALS = 2
ENGINE = Engine()  # with the server's in-step prefix deferral rule, as the suite runs
NO_DEFERRAL = Engine(deferral=None)


@dataclass(frozen=True)
class Mean:
    """One order's measurements at one point, averaged over the trials."""

    welfare_percent: float
    hit_rate: float
    mean_ttft: float
    evicted_tokens: float

    @classmethod
    def of(cls, trials: list[Measurement]) -> Mean:
        return cls(*(float(np.mean([getattr(m, f) for m in trials])) for f in cls.__annotations__))


@functools.cache
def _measured(kind: str, batch: int = QUEUE, deferral: bool = True) -> dict[str, Mean]:
    per_order: dict[str, list[Measurement]] = {order: [] for order in ORDERS}
    for trial in range(TRIALS):
        workload = WorkloadSpec(kind).make(QUEUE, seed=0, trial=trial)
        for order in ORDERS:
            engine = ENGINE if deferral else NO_DEFERRAL
            per_order[order].append(measure(workload, order, batch, engine))
    return {order: Mean.of(trials) for order, trials in per_order.items()}


def test_serving_follows_the_order_and_counts_cached_tokens() -> None:
    workload = WorkloadSpec("mixshare").make(200, seed=1, trial=0)
    order = queue_order("dfs-uniform", workload.queries, 200)
    served = serve(workload.queries, order, ENGINE)
    ttfts = [served.ttfts[i] for i in order]
    assert ttfts == sorted(ttfts)  # priority = place in the order: nothing overtakes
    prompt_tokens = sum(len(q.tokens) for q in workload.queries)
    assert served.hit_rate == pytest.approx(sum(served.cached_tokens) / prompt_tokens)


def test_stars_dfs_bid_gains_welfare_and_keeps_the_hit_rate() -> None:
    m = _measured("mixshare")
    assert m["dfs-bid"].welfare_percent > m["dfs-uniform"].welfare_percent + 10
    assert abs(m["dfs-bid"].hit_rate - m["dfs-uniform"].hit_rate) < 0.03
    # bid-sort has the most welfare and pays for it in cache misses and latency.
    assert m["bid-sort"].welfare_percent == max(x.welfare_percent for x in m.values())
    assert m["bid-sort"].hit_rate < m["dfs-bid"].hit_rate - 0.03
    assert m["bid-sort"].mean_ttft > m["dfs-bid"].mean_ttft


def test_the_lead_grows_with_the_batch() -> None:
    small, whole = _measured("mixshare", 32), _measured("mixshare")
    lead = {
        n: m["dfs-bid"].welfare_percent - m["dfs-uniform"].welfare_percent
        for n, m in ((32, small), (QUEUE, whole))
    }
    assert lead[32] < lead[QUEUE] / 3
    assert small["dfs-bid"].hit_rate < whole["dfs-bid"].hit_rate  # more sharing in a batch


@pytest.mark.parametrize(("kind", "slower"), [("trees-long", 3.0), ("chains", 2.0)])
def test_bid_sort_is_far_slower_when_the_workload_exceeds_the_cache(
    kind: str, slower: float
) -> None:
    m = _measured(kind)
    assert m["dfs-bid"].welfare_percent > m["dfs-uniform"].welfare_percent
    assert m["bid-sort"].welfare_percent > m["dfs-bid"].welfare_percent
    assert m["bid-sort"].mean_ttft > slower * m["dfs-bid"].mean_ttft
    assert m["bid-sort"].hit_rate < m["dfs-bid"].hit_rate / 2


def test_long_trees_dfs_bid_matches_dfs_uniform_in_cache_and_latency() -> None:
    m = _measured("trees-long", deferral=False)
    assert abs(m["dfs-bid"].hit_rate - m["dfs-uniform"].hit_rate) < 0.01
    assert m["dfs-bid"].mean_ttft == pytest.approx(m["dfs-uniform"].mean_ttft, rel=0.05)
    # With the deferral rule dfs-bid is 5.3% slower here (2.8% without): the rule makes a
    # held query wait two steps per tree level, and holds more of dfs-bid's early queries
    # behind others (docs/RESULTS.md, "In-step prefix deferral").
    m = _measured("trees-long")
    assert abs(m["dfs-bid"].hit_rate - m["dfs-uniform"].hit_rate) < 0.01
    assert m["dfs-bid"].mean_ttft == pytest.approx(m["dfs-uniform"].mean_ttft, rel=0.06)


def test_deferral_lifts_the_dfs_orders_to_the_flat_orders_hit_rate_on_short_trees() -> None:
    off, on = _measured("trees-short", deferral=False), _measured("trees-short")
    flat = max(on["bid-sort"].hit_rate, on["no-sort"].hit_rate)
    # Without the rule one prefill step admits a subtree's siblings, each computing the
    # prefix they share; the flat orders scatter them over steps.
    assert max(off["dfs-bid"].hit_rate, off["dfs-uniform"].hit_rate) < flat - 0.02
    assert min(on["dfs-bid"].hit_rate, on["dfs-uniform"].hit_rate) >= flat
    assert on["dfs-bid"].mean_ttft < off["dfs-bid"].mean_ttft
    # The rule applies to the auction's orders only: the flat orders are served as before.
    for order in ("bid-sort", "no-sort"):
        assert on[order] == off[order]


def test_short_trees_fit_so_ignoring_the_tree_costs_no_latency() -> None:
    # Without the deferral rule: with it, the DFS orders are the faster ones (test below).
    m = _measured("trees-short", deferral=False)
    assert m["bid-sort"].mean_ttft <= m["dfs-bid"].mean_ttft
    # The cache barely evicts, whatever the order.
    prompt_tokens = sum(
        len(q.tokens) for q in WorkloadSpec("trees-short").make(QUEUE, 0, 0).queries
    )
    assert max(x.evicted_tokens for x in m.values()) < 0.05 * prompt_tokens
    assert m["bid-sort"].welfare_percent > m["dfs-bid"].welfare_percent


def test_one_cluster_bidding_dfs_bid_equals_bid_sort() -> None:
    m = _measured("one-cluster", deferral=False)
    assert m["dfs-bid"].welfare_percent == pytest.approx(m["bid-sort"].welfare_percent, abs=1.0)
    assert m["dfs-bid"].welfare_percent > m["dfs-uniform"].welfare_percent + 20
    assert abs(m["dfs-bid"].hit_rate - m["dfs-uniform"].hit_rate) < 0.015
    assert m["bid-sort"].mean_ttft > 1.2 * m["dfs-bid"].mean_ttft
    # With the deferral rule the bidding cluster's members after the first wait for its first
    # token while unrelated zero bids, not held, take their steps: dfs-bid falls 8 points
    # short of bid-sort here (docs/RESULTS.md, "The rule's cost: one cluster").
    m = _measured("one-cluster")
    assert m["bid-sort"].welfare_percent - 10 < m["dfs-bid"].welfare_percent
    assert m["dfs-bid"].welfare_percent < m["bid-sort"].welfare_percent - 1
    assert m["dfs-bid"].welfare_percent > m["dfs-uniform"].welfare_percent + 20
    assert abs(m["dfs-bid"].hit_rate - m["dfs-uniform"].hit_rate) < 0.015


def test_autobidding_stays_within_budget_and_above_the_bound() -> None:
    # Six long trees: six users competing (a lone user would pay nothing).
    settings = AutobidSettings(auctions=12, queue=240)
    run = run_autobidding("long", settings, seed=0, trial=0)
    assert len(run.budgets) == 6
    assert len(run.paced) == len(run.bound) == 12
    assert all(p >= b for p, b in zip(run.paced, run.bound, strict=True))
    assert run.welfare_ratio <= 1.0
    for user, spend in run.spend.items():
        assert spend == sorted(spend)
        assert spend[-1] <= run.budgets[user]
    assert min(min(alphas) for alphas in run.alphas.values()) < 1.0  # budgets bind


def test_equal_pacing_has_condition_number_one() -> None:
    workload = WorkloadSpec("trees-short").make(400, seed=0, trial=0)  # two trees
    assert condition_number(workload, workload.values) == 1.0
    halved = [
        v // 2 if q.group == 0 else v
        for v, q in zip(workload.values, workload.queries, strict=True)
    ]
    assert condition_number(workload, halved) == pytest.approx(2.0, rel=1e-3)
    zeroed = [
        0 if q.group == 0 else v for v, q in zip(workload.values, workload.queries, strict=True)
    ]
    assert condition_number(workload, zeroed) == float("inf")
