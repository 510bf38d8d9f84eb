"""`experiment live`: one plan for four runs of the real server, and what is measured."""

from __future__ import annotations

import json
from pathlib import Path

from inference_auctions.experiments.live_market import run_live, write_live
from inference_auctions.experiments.live_metrics import overlap_welfare, welfare
from inference_auctions.experiments.live_plan import make_plan, tier_prices
from inference_auctions.experiments.live_run import RequestRecord

_PLAN = {"max_running_requests": 8, "cache_tokens": 23_000}


def test_one_seed_gives_every_run_the_same_arrivals_and_values() -> None:
    first, again = make_plan(3, 5, **_PLAN), make_plan(3, 5, **_PLAN)
    assert first == again
    other = make_plan(4, 5, **_PLAN)
    assert [(r.at, r.value_micros) for r in other.requests] != [
        (r.at, r.value_micros) for r in first.requests
    ]
    # The load is 1.5x the capacity measured on the engine's cost model.
    assert 1.0 < len(first.requests) / 5 / first.capacity_rps < 2.0
    assert set(first.budgets) == {r.tenant for r in first.requests} | set(first.budgets)


def test_tier_prices_follow_the_value_quantiles() -> None:
    values = list(range(1, 101))  # quantiles q(1/2) = 50, q(1/3) = 33, q(2/3) = 66
    assert tier_prices(values, 2) == [0, 25]
    assert tier_prices(values, 3) == [0, 11, 11 + 22]


def test_welfare_ranks_requests_by_first_token_within_windows() -> None:
    def record(index: int, sent: float, ttft: float | None, value: int) -> RequestRecord:
        return RequestRecord(index, "t", value, sent, ttft=ttft)

    # One window: the valuable request first (priority 1), then 0.5, then the failure (0).
    best = [record(0, 0.0, 0.1, 100), record(1, 0.1, 0.5, 10), record(2, 0.2, None, 50)]
    assert welfare(best) == (105, 100 * (105 / 80 - 1))
    worst = [record(0, 0.0, 0.9, 100), record(1, 0.1, 0.1, 10), record(2, 0.2, 0.2, 50)]
    assert welfare(worst)[0] == 10 + 25
    # Two windows are ranked apart: each lone request has priority 1.
    assert welfare([record(0, 0.0, 5.0, 7), record(1, 3.0, 0.1, 9)])[0] == 16


def test_the_overlap_measure_is_the_servers_rule_on_first_tokens() -> None:
    def record(index: int, sent: float, ttft: float | None, value: int) -> RequestRecord:
        return RequestRecord(index, "t", value, sent, ttft=ttft)

    # 0 waits 0..1 beside 1 (0.5..0.6) and 2 (from 0.8, never served); 3 comes at 9, while
    # 2 still waits.
    records = [
        record(0, 0.0, 1.0, 100),
        record(1, 0.5, 0.1, 10),
        record(2, 0.8, None, 50),
        record(3, 9.0, 0.5, 1_000),
    ]
    # Shares: 0 went ahead of 2 of {1, 2}, 1 of {0}, 2 of none of {0, 3}, 3 of {2}.
    weighted = 100 * 1 / 2 + 10 * 1 / 1 + 50 * 0 / 2 + 1_000 * 1 / 1
    assert overlap_welfare(records) == 100.0 * (weighted / (1_160 / 2) - 1.0)
    assert overlap_welfare(records[3:]) == 0.0  # alone: nothing to judge


def test_a_small_live_run_measures_the_four_schemes(tmp_path: Path) -> None:
    results = run_live(3.0, seed=1)
    paths = write_live(results, tmp_path)
    assert [p.name for p in paths] == ["results.json", "live.md", "live.png"]
    stored = json.loads((tmp_path / "results.json").read_text())
    assert set(stored) == {"settings", "fcfs", "tiers2", "tiers3", "auction"}
    assert stored["settings"]["request_fee_micros"] == 0
    planned = stored["settings"]["requests"]
    digests = {stored[s]["plan_digest"] for s in ("fcfs", "tiers2", "tiers3", "auction")}
    assert len(digests) == 1  # the same arrivals and values in every run
    for scheme in ("fcfs", "tiers2", "tiers3", "auction"):
        run = stored[scheme]
        assert run["requests"] == planned and run["requests_served"] == planned
        assert run["overspent_tenants"] == []
        assert len(run["ttft_p50_ms_by_value_decile"]) == 10
        assert 0 < run["cache_hit_rate"] < 1
    assert stored["fcfs"]["revenue_micros"] == 0
    for scheme in ("tiers2", "tiers3"):
        run = stored[scheme]
        prices = run["tier_prices_micros"]
        bought = sum(prices[tier] * count for tier, count in run["requests_by_tier"].items())
        assert run["revenue_micros"] == bought  # exactly the tier prices, nothing else
    assert "| auction |" in (tmp_path / "live.md").read_text()


def test_the_auction_without_its_posted_floor_runs_on_the_same_plan(tmp_path: Path) -> None:
    results = run_live(3.0, seed=1, schemes=("auction", "auction-no-floor"))
    write_live(results, tmp_path)
    floored, plain = results["auction"], results["auction-no-floor"]
    assert plain["plan_digest"] == floored["plan_digest"]
    planned = results["settings"]["requests"]
    # Below the floor a request waits, but it is served: nobody is lost, nobody overspends.
    for run in (floored, plain):
        assert run["requests_served"] == planned and run["overspent_tenants"] == []
    assert "| auction-no-floor |" in (tmp_path / "live.md").read_text()
