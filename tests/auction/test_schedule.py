"""The average-bid DFS (`server.auction.schedule`): a worked example, and properties against the
slow reference implementations."""

from __future__ import annotations

from fractions import Fraction

from hypothesis import given, settings

from inference_auctions.server.auction import AuctionRequest, run_auction
from inference_auctions.server.auction.reference import all_dfs_orders, reference_order, welfare
from tests.auction.exact import served_indexes
from tests.auction.strategies import batches


def test_equal_bids_give_the_dfs_uniform_arrival_order() -> None:
    prompts = [[5, 1], [7], [5, 2], [7, 1], [5, 1], [3]]
    batch = [AuctionRequest(f"q{i}", f"u{i}", p, 1000) for i, p in enumerate(prompts)]
    outcome = run_auction(batch)
    # Subtrees in order of their earliest arrival; inside them, again by arrival.
    assert outcome.order == ["q0", "q4", "q2", "q1", "q3", "q5"]


@given(batches(max_size=30))
def test_order_is_a_dfs_schedule(batch: list[AuctionRequest]) -> None:
    outcome = run_auction(batch)
    assert sorted(outcome.order) == sorted(r.rid for r in batch)
    # Every prefix of every prompt is a node: the requests under it must be served contiguously.
    prefixes = {tuple(r.tokens[:k]) for r in batch for k in range(len(r.tokens) + 1)}
    for prefix in prefixes:
        places = [
            outcome.positions[r.rid] for r in batch if tuple(r.tokens[: len(prefix)]) == prefix
        ]
        assert max(places) - min(places) + 1 == len(places), prefix


@given(batches(max_size=30))
def test_order_matches_the_reference_average_bid_dfs(batch: list[AuctionRequest]) -> None:
    outcome = run_auction(batch)
    assert served_indexes(outcome, batch) == reference_order(batch, [r.bid for r in batch])


@settings(max_examples=60)
@given(batches(max_size=6))
def test_welfare_is_the_best_over_all_dfs_schedules(batch: list[AuctionRequest]) -> None:
    outcome = run_auction(batch)
    bids = [r.bid for r in batch]
    best = max((welfare(order, bids) for order in all_dfs_orders(batch)), default=Fraction(0))
    assert outcome.welfare == best
    if batch:
        assert welfare(served_indexes(outcome, batch), bids) == best
