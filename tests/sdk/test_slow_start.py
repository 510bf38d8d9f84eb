"""The slow start of a bidder that joins a plan in progress: no full-value burst, a doubling
search for the multiplier, and a hand-over to the dual descent."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from inference_auctions.sdk import Budget, PacingBidder

START = datetime(2030, 1, 1, tzinfo=UTC)
BUDGET = Budget(total="10", auctions=100, start=START)
VALUE = 1_000_000


def _joined(spent: int = 6_000_000, auctions: int = 40) -> PacingBidder:
    """A fresh process whose first read of the ledger shows the plan's figures so far."""
    bidder = PacingBidder(BUDGET)
    bidder.sync_shared(
        marker=bidder.sync_marker(),
        spent_micros=spent,
        auctions=auctions,
        window=(START, None),
        now=START,
    )
    return bidder


def test_a_fresh_plan_still_opens_at_full_value() -> None:
    bidder = _joined(spent=0, auctions=0)
    assert not bidder.slow_start
    assert bidder.mu == 0.0
    assert bidder.bid([VALUE]) == [VALUE]


def test_joining_a_plan_in_progress_opens_with_the_target_not_the_value() -> None:
    bidder = _joined()
    assert bidder.slow_start
    # 4 credits left over the 60 auctions left: the first bid is the target itself.
    target = bidder.target_micros
    assert target == pytest.approx(4_000_000 / 60)
    (bid,) = bidder.bid([VALUE])
    assert abs(bid - target) <= 1
    assert bidder.alpha == pytest.approx(target / VALUE)
    assert bidder.budget_limited


def test_a_restart_after_auctions_without_spend_also_starts_slowly() -> None:
    # Auctions counted but nothing charged yet is still a plan in progress.
    assert _joined(spent=0, auctions=5).slow_start


def test_alpha_doubles_after_each_auction_below_target() -> None:
    bidder = _joined()
    (first,) = bidder.bid([VALUE])
    bidder.settle("b1", first // 4, reserved=first)
    (second,) = bidder.bid([VALUE])
    assert second == pytest.approx(2 * first, abs=2)
    bidder.settle("b2", second // 4, reserved=second)
    (third,) = bidder.bid([VALUE])
    assert third == pytest.approx(4 * first, abs=4)
    assert bidder.slow_start


def test_concurrent_bids_of_one_level_double_it_once() -> None:
    bidder = _joined()
    # Three requests in flight at the opening multiplier, all spending below the target:
    # the search doubles from the multiplier they went out at, once, not three times.
    bids = [bidder.bid([VALUE + i])[0] for i in range(3)]
    alpha = bidder.alpha
    for i, bid in enumerate(bids):
        bidder.settle(f"b{i}", bid // 4, reserved=bid)
    assert bidder.alpha == pytest.approx(2 * alpha)


def test_spending_a_target_ahead_of_the_search_hands_over_to_the_dual_descent() -> None:
    bidder = _joined()
    bidder.bid([VALUE])
    bidder.settle("b1", 0, reserved=bidder.in_flight_micros)
    (bid,) = bidder.bid([VALUE])
    level = bidder.alpha
    # The search has now spent more than its two auctions' targets and one more.
    bidder.settle("b2", int(3.5 * bidder.target_micros), reserved=bid)
    assert not bidder.slow_start
    assert bidder.alpha == pytest.approx(level)
    # From here on the dual descent moves mu: a charge of 0 lowers it by eta * gamma, which
    # with eta = eta0 / (gamma * sqrt(T)) is eta0 / sqrt(100).
    mu = bidder.mu
    (bid,) = bidder.bid([VALUE])
    bidder.settle("b3", 0, reserved=bid)
    assert bidder.mu == pytest.approx(mu - BUDGET.eta0 / 10)


def test_one_heavy_charge_early_in_the_search_does_not_stop_it() -> None:
    bidder = _joined()
    for i in range(2):  # two auctions below target...
        (bid,) = bidder.bid([VALUE])
        bidder.settle(f"b{i}", 0, reserved=bid)
    (bid,) = bidder.bid([VALUE])
    level = bidder.alpha
    # ...then one charge of more than the three auctions' targets, but not a target ahead:
    # a single heavy charge, which the next auctions of this multiplier may well not repeat.
    bidder.settle("b2", int(3.5 * bidder.target_micros), reserved=bid)
    assert bidder.slow_start
    assert bidder.alpha == pytest.approx(2 * level)


def test_full_value_below_target_ends_the_search_at_mu_zero() -> None:
    bidder = _joined()
    # Values close to the target: two doublings reach full value without spending it.
    value = int(bidder.target_micros * 3)
    for i in range(3):
        (bid,) = bidder.bid([value])
        bidder.settle(f"b{i}", 0, reserved=bid)
    assert not bidder.slow_start
    assert bidder.mu == 0.0
    assert bidder.bid([value]) == [value]


def test_a_restored_multiplier_needs_no_search() -> None:
    learned = PacingBidder(BUDGET)
    learned._mu = 3.0  # as if learned before the restart
    bidder = PacingBidder.from_state(BUDGET, learned.to_state())
    bidder.sync_shared(
        marker=bidder.sync_marker(),
        spent_micros=6_000_000,
        auctions=40,
        window=(START, None),
        now=START,
    )
    assert not bidder.slow_start
    assert bidder.bid([VALUE]) == [VALUE // 4]


def test_a_later_sync_does_not_restart_the_search() -> None:
    bidder = _joined(spent=0, auctions=0)
    (bid,) = bidder.bid([VALUE])
    bidder.settle("b1", 300_000, reserved=bid)
    bidder.sync_shared(
        marker=bidder.sync_marker(),
        spent_micros=5_000_000,
        auctions=30,
        window=(START, None),
        now=START,
    )
    assert not bidder.slow_start


def test_joining_spends_one_charge_where_full_value_spends_one_per_auction() -> None:
    """The opening auctions against a rival price of a fifth of the value (three times the
    target): full value pays it every time; the search pays it once, when it finds it."""
    spent = {}
    for name, bidder in (("joined", _joined()), ("full value", _joined(0, 0))):
        before = bidder.spent_micros
        for i in range(3):
            (bid,) = bidder.bid([VALUE])
            charge = VALUE // 5 if bid > VALUE // 5 else 0
            bidder.settle(f"b{i}", charge, reserved=bid)
        spent[name] = bidder.spent_micros - before
    assert spent == {"full value": 3 * VALUE // 5, "joined": VALUE // 5}
