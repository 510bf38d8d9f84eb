"""What a batch charges (`server.auction.charges`): worked examples of `run_auction`, and the
fast VCG payments against the slow reference implementations."""

from __future__ import annotations

from fractions import Fraction

from hypothesis import given, settings
from hypothesis import strategies as st

from inference_auctions.server.auction import AuctionOutcome, AuctionRequest, run_auction
from inference_auctions.server.auction.reference import reference_order, reference_payments
from tests.auction.exact import exact_payments, served_indexes
from tests.auction.strategies import batches, long_batches, misreports


def test_worked_example_order_and_payments() -> None:
    batch = [
        AuctionRequest("r1", "alice", [1, 2, 3], 5),
        AuctionRequest("r2", "bob", [1, 2, 4], 10),
        AuctionRequest("r3", "carol", [9], 7),
        AuctionRequest("r4", "bob", [1, 2], 1),
    ]
    outcome = run_auction(batch)
    # Root: subtree [1, 2] averages 16/3 < 7, so carol's lone request goes first.
    assert outcome.order == ["r3", "r2", "r1", "r4"]
    # Without carol's bid the [1, 2] subtree would go first: 41/3 instead of 25/3 for the others.
    assert exact_payments(batch) == {
        "alice": Fraction(1, 3),
        "bob": Fraction(5, 3),
        "carol": Fraction(16, 3),
    }
    assert outcome.payments == {"alice": 0, "bob": 1, "carol": 5}
    assert outcome.revenue == 6
    assert outcome.welfare == Fraction(7 * 3 + 10 * 2 + 5 * 1, 3)
    assert outcome.priorities == {"r3": 1.0, "r2": 2 / 3, "r1": 1 / 3, "r4": 0.0}
    assert (outcome.tree.nodes, outcome.tree.depth) == (4, 2)
    assert (outcome.tree.total_tokens, outcome.tree.unique_tokens, outcome.tree.shared_tokens) == (
        9,
        5,
        4,
    )


def test_a_user_with_several_requests_pays_once() -> None:
    batch = [
        AuctionRequest("a1", "alice", [1], 9),
        AuctionRequest("a2", "alice", [2], 8),
        AuctionRequest("b1", "bob", [3], 1),
    ]
    outcome = run_auction(batch)
    assert set(outcome.payments) == {"alice", "bob"}
    assert outcome.order == ["a1", "a2", "b1"]
    # Alice pushes bob from first to last: 1 * (1 - 0) = 1 micro-credit of externality.
    assert exact_payments(batch)["alice"] == 1


def test_single_request_and_empty_batches() -> None:
    alone = run_auction([AuctionRequest("only", "alice", [1, 2], 42)])
    assert alone.order == ["only"]
    assert alone.payments == {"alice": 0}
    assert alone.priority("only") == 1
    empty = run_auction([])
    assert (empty.order, empty.payments, empty.revenue) == ([], {}, 0)


def _value(outcome: AuctionOutcome, batch: list[AuctionRequest], user: str) -> Fraction:
    """The user's reported value for the outcome: sum of bid * fractional priority."""
    return sum(
        (r.bid * outcome.priority(r.rid) for r in batch if r.user == user), start=Fraction(0)
    )


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
    assert served_indexes(outcome, batch) == reference_order(batch, [r.bid for r in batch])
    assert exact_payments(batch) == reference_payments(batch)


@settings(max_examples=150)
@given(long_batches())
def test_long_shared_prefixes_agree_with_the_oracle(batch: list[AuctionRequest]) -> None:
    outcome = run_auction(batch)
    assert served_indexes(outcome, batch) == reference_order(batch, [r.bid for r in batch])
    assert exact_payments(batch) == reference_payments(batch)
    unique = {tuple(r.tokens[:k]) for r in batch for k in range(1, len(r.tokens) + 1)}
    assert outcome.tree.unique_tokens == len(unique)
