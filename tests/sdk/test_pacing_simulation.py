"""The pacing bidder in a stationary market: it spends the budget, and learns at sqrt(T)."""

from __future__ import annotations

import numpy as np

from bench.pacing_regret import Market, best_fixed_multiplier, loglog_slope, simulate, sweep

MARKET = Market()


def spend_rate() -> float:
    return MARKET.spend_rate(np.random.default_rng(7), samples=20_000)


def test_a_binding_budget_is_spent() -> None:
    gamma = 0.5 * spend_rate()
    for seed in range(3):
        run = simulate(MARKET, 2000, gamma, seed=seed)
        assert 0.95 < run.utilization <= 1.0
        assert run.mean_alpha < 0.9  # values were shaded to stretch the budget


def test_a_loose_budget_leaves_values_unshaded() -> None:
    gamma = 4.0 * spend_rate()
    for seed in range(3):
        run = simulate(MARKET, 2000, gamma, seed=seed)
        assert run.alpha > 0.95
        assert run.mean_alpha > 0.95
        assert run.utilization < 0.5
        assert run.regret < 1.0  # nothing to learn: bidding value is optimal


def test_regret_grows_like_the_square_root_of_the_horizon() -> None:
    rows = sweep(MARKET, (100, 300, 1000, 3000), seeds=8, budget_share=0.5)
    assert all(row.regret > 0 for row in rows)
    assert 0.3 < loglog_slope(rows) < 0.7


def test_the_hindsight_benchmark_respects_the_budget() -> None:
    values = [10, 10]
    bids = [[2, 6], [4, 8]]  # one competitor outranked per breakpoint, k = 2
    # Alone, each breakpoint pays c/2: 1, 2, 3, 4. With budget 3 the best is alpha in
    # [5/10, 7/10): outranks 2 and 4, utility (8 + 6) / 2 = 7, spend 3.
    utility, alpha = best_fixed_multiplier(values, bids, budget=3)
    assert utility == 7.0
    assert alpha == 0.5
    assert best_fixed_multiplier(values, bids, budget=0) == (0.0, 0.0)
