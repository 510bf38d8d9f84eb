"""Property tests of the auction core against the slow reference implementations."""

from __future__ import annotations

from fractions import Fraction

from hypothesis import given, settings
from hypothesis import strategies as st

from inference_auctions.server.auction import AuctionOutcome, AuctionRequest, run_auction
from inference_auctions.server.auction.reference import (
    all_dfs_orders,
    reference_order,
    reference_payments,
    welfare,
)
from tests.auction.exact import exact_payments
from tests.auction.strategies import batches, long_batches, misreports


def _indexes(outcome: AuctionOutcome, batch: list[AuctionRequest]) -> list[int]:
    where = {request.rid: index for index, request in enumerate(batch)}
    return [where[rid] for rid in outcome.order]


def _value(outcome: AuctionOutcome, batch: list[AuctionRequest], user: str) -> Fraction:
    """The user's reported value for the outcome: sum of bid * fractional priority."""
    return sum(
        (r.bid * outcome.priority(r.rid) for r in batch if r.user == user), start=Fraction(0)
    )


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
    assert _indexes(outcome, batch) == reference_order(batch, [r.bid for r in batch])


@settings(max_examples=60)
@given(batches(max_size=6))
def test_welfare_is_the_best_over_all_dfs_schedules(batch: list[AuctionRequest]) -> None:
    outcome = run_auction(batch)
    bids = [r.bid for r in batch]
    best = max((welfare(order, bids) for order in all_dfs_orders(batch)), default=Fraction(0))
    assert outcome.welfare == best
    if batch:
        assert welfare(_indexes(outcome, batch), bids) == best


@given(batches(max_size=30))
def test_fast_payments_equal_the_naive_ones_exactly(batch: list[AuctionRequest]) -> None:
    outcome = run_auction(batch)
    naive = reference_payments(batch)
    assert exact_payments(batch) == naive
    assert outcome.payments == {user: p.numerator // p.denominator for user, p in naive.items()}


@given(batches(max_size=30))
def test_payments_are_between_zero_and_the_reported_value(batch: list[AuctionRequest]) -> None:
    outcome = run_auction(batch)
    for user, payment in exact_payments(batch).items():
        value = _value(outcome, batch, user)
        assert 0 <= payment <= value
        assert 0 <= outcome.payments[user] <= value


@settings(max_examples=300)
@given(st.data())
def test_no_misreport_raises_a_users_utility(data: st.DataObject) -> None:
    truth = data.draw(batches(max_size=10).filter(bool))
    user = data.draw(st.sampled_from(sorted({r.user for r in truth})))
    lie = data.draw(misreports(truth, user))
    honest, strategic = run_auction(truth), run_auction(lie)
    # Utility is always judged with the user's true values.
    honest_utility = _value(honest, truth, user) - exact_payments(truth)[user]
    strategic_utility = _value(strategic, truth, user) - exact_payments(lie)[user]
    assert strategic_utility <= honest_utility
    # Charging floor(p) can shift a utility by less than one micro-credit, never more.
    rounded_gain = (_value(strategic, truth, user) - strategic.payments[user]) - (
        _value(honest, truth, user) - honest.payments[user]
    )
    assert rounded_gain < 1


@settings(max_examples=25)
@given(batches(max_size=120))
def test_large_batches_agree_with_the_oracle(batch: list[AuctionRequest]) -> None:
    outcome = run_auction(batch)
    assert _indexes(outcome, batch) == reference_order(batch, [r.bid for r in batch])
    assert exact_payments(batch) == reference_payments(batch)


@settings(max_examples=150)
@given(long_batches())
def test_long_shared_prefixes_agree_with_the_oracle(batch: list[AuctionRequest]) -> None:
    outcome = run_auction(batch)
    assert _indexes(outcome, batch) == reference_order(batch, [r.bid for r in batch])
    assert exact_payments(batch) == reference_payments(batch)
    unique = {tuple(r.tokens[:k]) for r in batch for k in range(1, len(r.tokens) + 1)}
    assert outcome.tree.unique_tokens == len(unique)
