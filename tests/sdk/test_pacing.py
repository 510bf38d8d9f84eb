"""The pacing bidder: update sign and bounds, exact bids, the guard, batches, state."""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime, timedelta
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from inference_auctions.sdk import Budget, BudgetExhaustedError, ConfigurationError, PacingBidder
from inference_auctions.sdk._pacing import _scale

CREDIT = 1_000_000


class Clock:
    """A hand-driven clock."""

    def __init__(self, start: datetime) -> None:
        self.now = start.timestamp()

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def horizon_bidder(total: str = "100", auctions: int = 100, **kwargs: object) -> PacingBidder:
    return PacingBidder(Budget(total=total, auctions=auctions, **kwargs))  # type: ignore[arg-type]


def test_a_fresh_bidder_bids_full_value() -> None:
    bidder = horizon_bidder()
    assert (bidder.mu, bidder.alpha) == (0.0, 1.0)
    assert bidder.bid([5 * CREDIT]) == [5 * CREDIT]
    assert bidder.in_flight_micros == 5 * CREDIT
    assert not bidder.budget_limited


def test_update_sign_follows_spend_against_target() -> None:
    # gamma = 1 credit, eta = 1 / (gamma * sqrt(100)).
    bidder = horizon_bidder()
    assert bidder.target_micros == CREDIT
    (bid,) = bidder.bid([10 * CREDIT])
    bidder.settle("b1", 3 * CREDIT, reserved=bid)
    assert bidder.mu == pytest.approx(0.2)
    assert bidder.alpha == pytest.approx(1 / 1.2)
    assert bidder.budget_limited

    bidder.observe("b2", CREDIT)  # exactly on target: no move
    assert bidder.mu == pytest.approx(0.2)

    bidder.observe("b3", 0)  # below target: alpha rises
    assert bidder.mu == pytest.approx(0.1)
    bidder.observe("b4", 0)
    bidder.observe("b5", 0)
    assert bidder.mu == 0.0  # clipped at 0, never negative
    assert bidder.alpha == 1.0


def test_mu_is_clipped_at_v_max_over_gamma() -> None:
    bidder = horizon_bidder(total="1000", auctions=100)  # gamma = 10 credits
    bidder.release(bidder.bid([20 * CREDIT])[0])
    for i in range(50):
        bidder.observe(f"b{i}", 500 * CREDIT)
    assert bidder.mu == pytest.approx(20 * CREDIT / (10 * CREDIT))
    # At mu_max even the largest value bids below the target spend.
    assert bidder.bid([20 * CREDIT])[0] < bidder.target_micros


@given(
    value=st.integers(min_value=0, max_value=10**12),
    mu=st.floats(min_value=0.0, max_value=1e6, allow_nan=False),
)
def test_bids_are_floor_of_alpha_times_value_and_never_above_it(value: int, mu: float) -> None:
    expected = math.floor(Fraction(value) / (1 + Fraction(mu)))
    assert _scale(value, mu) == expected
    assert 0 <= _scale(value, mu) <= value


def test_guard_scales_bids_to_the_remaining_budget() -> None:
    bidder = horizon_bidder(total="1", auctions=10, pacing="asap")
    assert bidder.bid([800_000, 800_000]) == [500_000, 500_000]
    assert bidder.budget_limited
    assert bidder.available_micros == 0
    assert bidder.bid([CREDIT]) == [0]  # everything is in flight already
    bidder.settle("b1", 600_000, reserved=1_000_000)
    assert bidder.remaining_micros == 400_000
    assert bidder.bid([CREDIT]) == [400_000]


def test_bid_caps_apply() -> None:
    bidder = horizon_bidder(max_bid="2")
    assert bidder.bid([5 * CREDIT]) == [2 * CREDIT]
    assert bidder.bid([5 * CREDIT], max_bid=CREDIT) == [CREDIT]


def test_asap_bids_full_value_until_the_budget_is_gone() -> None:
    bidder = horizon_bidder(total="3", auctions=100, pacing="asap")
    for i in range(2):
        (bid,) = bidder.bid([CREDIT])
        assert bid == CREDIT
        bidder.settle(f"b{i}", bid, reserved=bid)
    assert bidder.mu == 0.0
    assert bidder.bid([5 * CREDIT]) == [CREDIT]
    bidder.settle("b9", CREDIT, reserved=CREDIT)
    assert bidder.bid([5 * CREDIT]) == [0]
    assert bidder.spent_micros == 3 * CREDIT


def test_charges_are_aggregated_per_batch() -> None:
    single = horizon_bidder()
    single.release(single.bid([2 * CREDIT])[0])
    single.observe("b", 3 * CREDIT)

    bidder = horizon_bidder()
    bids = [bidder.bid([2 * CREDIT])[0] for _ in range(3)]
    # Each of our three requests in batch "b" reports the same total charge.
    assert bidder.settle("b", 3 * CREDIT, reserved=bids[0], rid="r0") is True
    assert bidder.settle("b", 3 * CREDIT, reserved=bids[1], rid="r1") is False
    assert bidder.settle("b", 3 * CREDIT, reserved=bids[2], rid="r2") is False
    assert bidder.spent_micros == 3 * CREDIT
    assert bidder.auctions == 1
    assert bidder.in_flight_micros == 0
    assert bidder.mu == single.mu  # the update ran once
    assert bidder.charges == {"b": 3 * CREDIT}


def test_a_refund_undoes_a_batch_only_when_its_last_request_failed() -> None:
    bidder = horizon_bidder()
    bidder.observe("solo", 2 * CREDIT, rid="r1")
    assert bidder.refund("solo", "r1") == 2 * CREDIT
    assert bidder.spent_micros == 0

    bidder.observe("pair", 2 * CREDIT, rid="r2")
    bidder.observe("pair", 2 * CREDIT, rid="r3")
    assert bidder.refund("pair", "r2") == 0  # r3 succeeded: only the ledger knows the split
    assert bidder.spent_micros == 2 * CREDIT
    assert bidder.refund("unknown", "r9") == 0


def test_unknown_outcomes_count_the_whole_bid() -> None:
    bidder = horizon_bidder()
    (bid,) = bidder.bid([4 * CREDIT])
    bidder.settle_unknown(bid)
    assert (bidder.spent_micros, bidder.in_flight_micros) == (4 * CREDIT, 0)
    assert bidder.auctions == 0


def test_sync_replaces_spend_and_remembers_ledger_batches() -> None:
    bidder = horizon_bidder()
    bidder.settle_unknown(bidder.bid([4 * CREDIT])[0])
    bidder.sync(CREDIT, batches={"b1": CREDIT})
    assert bidder.spent_micros == CREDIT
    # The ledger already counted b1, so its late report adds nothing.
    assert bidder.observe("b1", CREDIT) is False
    assert bidder.spent_micros == CREDIT


def test_reserve_grants_at_most_what_is_available() -> None:
    bidder = horizon_bidder(total="1")
    assert bidder.reserve(700_000) == 700_000
    assert bidder.reserve(700_000) == 300_000
    bidder.release(1_000_000)
    assert bidder.available_micros == CREDIT


def test_negative_inputs_are_rejected() -> None:
    bidder = horizon_bidder()
    with pytest.raises(ValueError, match="negative"):
        bidder.bid([-1])
    with pytest.raises(ValueError, match="negative"):
        bidder.observe("b", -1)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.lists(st.integers(min_value=0, max_value=5 * CREDIT), min_size=1, max_size=4),
            st.integers(min_value=0, max_value=3),
            st.booleans(),
        ),
        min_size=1,
        max_size=60,
    ),
    st.integers(min_value=1, max_value=20 * CREDIT),
)
def test_adversarial_full_bid_charges_never_exceed_the_budget(
    steps: list[tuple[list[int], int, bool]], total: int
) -> None:
    """Every batch charges the full sum of our bids in it; in-flight requests pile up."""
    bidder = PacingBidder(Budget(total=f"{total / CREDIT:.6f}", auctions=10))
    in_flight: list[tuple[str, int]] = []
    charged = 0
    for n, (values, clear, lost) in enumerate(steps):
        for i, bid in enumerate(bidder.bid(values)):
            in_flight.append((f"r{n}.{i}", bid))
        # Clear a batch made of the oldest `clear` requests, charging all they bid.
        batch, in_flight = in_flight[:clear], in_flight[clear:]
        charge = sum(bid for _, bid in batch)
        charged += charge
        for rid, bid in batch:
            if lost:
                bidder.settle_unknown(bid)
            else:
                bidder.settle(f"batch{n}", charge, reserved=bid, rid=rid)
        assert charged <= total
        assert bidder.spent_micros <= total
        assert charged + sum(bid for _, bid in in_flight) <= total


def test_state_round_trips_through_json() -> None:
    bidder = horizon_bidder()
    (bid,) = bidder.bid([10 * CREDIT])
    bidder.settle("b1", 3 * CREDIT, reserved=bid, rid="r1")
    state = json.loads(json.dumps(bidder.to_state()))
    restored = PacingBidder.from_state(bidder.budget, state)
    assert restored.mu == bidder.mu
    assert restored.spent_micros == 3 * CREDIT
    assert restored.auctions == 1
    assert restored.spend_since == bidder.spend_since
    assert restored.observe("b1", 3 * CREDIT) is False  # no double count after a restart
    # The largest value seen, which bounds the multiplier, survives too.
    assert restored.to_state()["v_max_micros"] == 10 * CREDIT


def test_state_of_another_budget_keeps_only_the_multiplier() -> None:
    bidder = horizon_bidder()
    bidder.observe("b1", 3 * CREDIT)
    restored = PacingBidder.from_state(Budget(total="200", auctions=100), bidder.to_state())
    assert restored.mu == bidder.mu
    assert (restored.spent_micros, restored.auctions) == (0, 0)


def test_bad_state_is_a_configuration_error() -> None:
    budget = Budget(total="1", auctions=1)
    with pytest.raises(ConfigurationError):
        PacingBidder.from_state(budget, {"version": 99})
    with pytest.raises(ConfigurationError):
        PacingBidder.from_state(budget, {"version": 1, "mu": "x"})


def test_periodic_budget_renews_and_keeps_the_multiplier() -> None:
    clock = Clock(datetime(2030, 1, 1, 12, tzinfo=UTC))
    bidder = PacingBidder(Budget(total="10", period="day"), clock=clock)
    assert bidder.window == (datetime(2030, 1, 1, tzinfo=UTC), datetime(2030, 1, 2, tzinfo=UTC))
    (bid,) = bidder.bid([8 * CREDIT])
    bidder.settle("b1", bid, reserved=bid)
    for i in range(20):
        clock.advance(60)
        bidder.settle(f"c{i}", 0, reserved=bidder.bid([CREDIT])[0])
    mu = bidder.mu
    assert bidder.spent_micros == 8 * CREDIT
    clock.advance(13 * 3600)
    assert bidder.remaining_micros == 10 * CREDIT
    assert bidder.spent_micros == 0
    assert bidder.mu == mu
    assert bidder.spend_since == datetime(2030, 1, 2, tzinfo=UTC)


def test_periodic_target_follows_the_observed_rate() -> None:
    start = datetime(2030, 1, 1, tzinfo=UTC)
    clock = Clock(start)
    bidder = PacingBidder(Budget(total="24", period=timedelta(days=1)), clock=clock)
    # Nothing seen yet: one more auction expected, the whole budget is the target.
    assert bidder.target_micros == 24 * CREDIT
    for i in range(60):  # one auction a minute for an hour, each charged nothing
        clock.advance(60)
        bidder.observe(f"b{i}", 0)
    expected_left = (60 / 3600) * (23 * 3600)
    assert bidder.target_micros == pytest.approx(24 * CREDIT / expected_left)


def test_declared_auctions_per_period_set_the_starting_rate() -> None:
    clock = Clock(datetime(2030, 1, 1, tzinfo=UTC))
    budget = Budget(total="1440", period=timedelta(days=1), auctions=1440)
    bidder = PacingBidder(budget, clock=clock)
    assert bidder.target_micros == pytest.approx(CREDIT)


def test_periodic_state_carries_over_within_the_same_period() -> None:
    clock = Clock(datetime(2030, 1, 1, 9, tzinfo=UTC))
    budget = Budget(total="10", period="day")
    bidder = PacingBidder(budget, clock=clock)
    bidder.observe("b1", 2 * CREDIT)
    state = bidder.to_state()
    clock.advance(3600)
    assert PacingBidder.from_state(budget, state, clock=clock).spent_micros == 2 * CREDIT
    clock.advance(24 * 3600)
    later = PacingBidder.from_state(budget, state, clock=clock)
    assert later.spent_micros == 0
    assert later.mu == bidder.mu


def test_the_multiplier_freezes_once_the_budget_is_spent() -> None:
    bidder = horizon_bidder(total="2", auctions=10)
    for i, value in enumerate([1_500_000, 10 * CREDIT]):
        (bid,) = bidder.bid([value])
        bidder.settle(f"b{i}", bid, reserved=bid)
    assert bidder.remaining_micros == 0
    mu = bidder.mu
    for i in range(5):
        bidder.settle(f"z{i}", 0, reserved=bidder.bid([CREDIT])[0])
    assert bidder.mu == mu > 0
    assert bidder.budget_limited


def test_the_guard_leaves_room_for_the_request_fees() -> None:
    bidder = horizon_bidder(total="1", auctions=10, pacing="asap")
    bidder.set_request_fee(100_000)
    # Two requests: 200,000 of fees first, the bids share the rest.
    assert bidder.bid([800_000, 800_000]) == [400_000, 400_000]
    assert bidder.in_flight_micros == CREDIT and bidder.available_micros == 0
    with pytest.raises(BudgetExhaustedError, match="request fee of 100000"):
        bidder.bid([0])  # a zero bid is not free: nothing is sent, nothing reserved
    assert bidder.in_flight_micros == CREDIT
    # Charged 300,000 and a fee for each request: half the budget spent, nothing in flight.
    bidder.settle("b1", 300_000 + 100_000, reserved=500_000, rid="a", per_request=True)
    bidder.settle("b1", 100_000, reserved=500_000, rid="b", per_request=True)
    assert bidder.spent_micros == 500_000
    assert bidder.bid([CREDIT]) == [400_000]
    bidder.release(500_000)
    bidder.settle("b2", 450_000, reserved=0)
    assert bidder.remaining_micros == 50_000 and bidder.exhausted  # less than one fee left


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.lists(st.integers(min_value=0, max_value=5 * CREDIT), min_size=1, max_size=4),
            st.integers(min_value=0, max_value=3),
        ),
        min_size=1,
        max_size=40,
    ),
    st.integers(min_value=1, max_value=5 * CREDIT),
    st.integers(min_value=1, max_value=CREDIT),
)
def test_full_bid_charges_and_fees_never_exceed_the_budget(
    steps: list[tuple[list[int], int]], total: int, fee: int
) -> None:
    """Every request pays its fee and its batch charges the full sum of its bids."""
    bidder = PacingBidder(Budget(total=f"{total / CREDIT:.6f}", auctions=10))
    bidder.set_request_fee(fee)
    in_flight: list[tuple[str, int]] = []
    paid = 0
    for n, (values, clear) in enumerate(steps):
        try:
            bids = bidder.bid(values)
        except BudgetExhaustedError:
            bids = []  # nothing sent
        in_flight += [(f"r{n}.{i}", bid) for i, bid in enumerate(bids)]
        batch, in_flight = in_flight[:clear], in_flight[clear:]
        for rid, bid in batch:  # each request's share: its whole bid, and its fee
            bidder.settle(f"b{n}", bid + fee, reserved=bid + fee, rid=rid, per_request=True)
            paid += bid + fee
        assert paid <= total
        assert paid + sum(bid + fee for _, bid in in_flight) <= total
