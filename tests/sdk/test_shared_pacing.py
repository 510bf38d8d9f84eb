"""Pacing on ledger-wide figures: syncs, per-request charge shares, the end of a period."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from inference_auctions.sdk import Auction, Budget, PacingBidder
from inference_auctions.sdk._pacing import SyncMarker
from inference_auctions.sdk._settlement import Settlement

START = datetime(2030, 1, 1, tzinfo=UTC)


def _auction(**charges: int) -> Auction:
    return Auction.model_validate(
        {
            "batch_id": "b1",
            "position": 0,
            "batch_size": 4,
            "priority": 1.0,
            "bid_micros": 500_000,
            **charges,
        }
    )


def test_an_old_server_gives_the_batch_charge_for_both_names() -> None:
    a = _auction(charge_micros=300_000)
    assert (a.user_batch_charge_micros, a.request_charge_micros) == (300_000, 300_000)
    assert not a.per_request_charges
    b = _auction(charge_micros=300_000, user_batch_charge_micros=300_000, request_charge_micros=1)
    assert (b.user_batch_charge_micros, b.request_charge_micros, b.charge_micros) == (
        300_000,
        1,
        300_000,
    )
    assert b.per_request_charges
    # A dump reads back the same, including whether the charge was split.
    assert Auction.model_validate(b.model_dump()) == b
    assert not Auction.model_validate(a.model_dump()).per_request_charges


@pytest.mark.parametrize("per_request", [False, True])
def test_three_requests_of_one_batch_are_counted_once(per_request: bool) -> None:
    bidder = PacingBidder(Budget(total="10", auctions=100))
    shares = [100_000, 150_000, 50_000]  # the user's batch charge is 300,000
    for i, share in enumerate(shares):
        (bid,) = bidder.bid([500_000])
        fields = {"charge_micros": 300_000}
        if per_request:
            fields |= {"user_batch_charge_micros": 300_000, "request_charge_micros": share}
        settlement = Settlement(bidder, rid=f"r{i}", reserved=bid, on_change=lambda: None)
        settlement.charged(_auction(**fields))
    assert bidder.spent_micros == 300_000
    assert bidder.auctions == 1
    assert bidder.in_flight_micros == 0


def test_a_sync_keeps_the_charges_seen_while_it_was_under_way() -> None:
    bidder = PacingBidder(Budget(total="10", auctions=100, start=START))
    marker = bidder.sync_marker()
    bidder.observe("mine", 70_000)  # arrives while the ledger is being read
    bidder.sync_shared(
        marker=marker, spent_micros=1_000_000, auctions=12, window=(START, None), now=START
    )
    assert bidder.spent_micros == 1_070_000
    assert bidder.auctions == 13
    # The next sync has the charge in the ledger figure; nothing is counted twice for good.
    bidder.sync_shared(
        marker=bidder.sync_marker(),
        spent_micros=1_070_000,
        auctions=13,
        window=(START, None),
        now=START,
    )
    assert bidder.spent_micros == 1_070_000


def test_every_process_derives_the_same_target_from_the_same_figures() -> None:
    clock = (START + timedelta(minutes=30)).timestamp
    budget = Budget(total="6", period=timedelta(hours=1), start=START)
    targets = []
    for _ in range(3):
        bidder = PacingBidder(budget, clock=clock)
        bidder.sync_shared(
            marker=bidder.sync_marker(),
            spent_micros=2_000_000,
            auctions=300,
            window=(START, START + timedelta(hours=1)),
            now=START + timedelta(minutes=30),
        )
        targets.append(bidder.target_micros)
    # 4 credits left over the 300 auctions the user's rate predicts for the 30 minutes left.
    assert targets == [pytest.approx(4_000_000 / 300)] * 3


def test_shared_horizon_target_is_what_is_left_over_the_auctions_left() -> None:
    bidder = PacingBidder(Budget(total="10", auctions=100, start=START))
    assert bidder.target_micros == 100_000  # alone: total / T
    bidder.sync_shared(
        marker=bidder.sync_marker(),
        spent_micros=6_000_000,
        auctions=40,
        window=(START, None),
        now=START,
    )
    assert bidder.target_micros == pytest.approx(4_000_000 / 60)


def test_the_multiplier_fades_out_over_the_last_tenth_of_a_period() -> None:
    now = [START.timestamp()]
    budget = Budget(total="1", period=timedelta(seconds=100), start=START)
    bidder = PacingBidder(budget, clock=lambda: now[0])
    bidder._mu = 1.0  # as if learned: half of every value
    assert bidder.bid([1000]) == [500]
    now[0] += 95  # half-way through the final tenth: alpha half-way from 0.5 to 1
    assert bidder.bid([1000]) == [750]
    now[0] += 4.999
    assert bidder.bid([1000]) == [999]


def test_a_large_multiplier_fades_out_as_fast_as_a_small_one() -> None:
    now = [START.timestamp() + 95]  # half-way through the final tenth
    budget = Budget(total="1", period=timedelta(seconds=100), start=START)
    bidder = PacingBidder(budget, clock=lambda: now[0])
    bidder._mu = 19.0  # a small target late in the plan: a twentieth of every value
    # Half-way from 0.05 to 1; scaling mu by the fade would still bid 1000 / 10.5 = 95 here.
    assert bidder.bid([1000]) == [524]  # 525, rounded down through the float ratio


def test_a_charge_counted_twice_for_safety_does_not_exhaust_the_budget() -> None:
    bidder = PacingBidder(Budget(total="1", auctions=100, start=START))
    marker = bidder.sync_marker()
    bidder.observe("seen-during-the-read", 300_000)
    # The ledger's figure may already include that charge: the guard counts it twice...
    bidder.sync_shared(
        marker=marker, spent_micros=900_000, auctions=5, window=(START, None), now=START
    )
    assert bidder.spent_micros == 1_200_000 and bidder.available_micros == 0
    # ...but the budget is declared spent only on what the ledger confirmed.
    assert not bidder.exhausted
    bidder.sync_shared(
        marker=bidder.sync_marker(),
        spent_micros=900_000,
        auctions=5,
        window=(START, None),
        now=START,
    )
    assert not bidder.exhausted and bidder.available_micros == 100_000
    bidder.observe("after", 100_000)
    assert bidder.exhausted


def _shared_near_the_end(
    held_micros: int, bidder: PacingBidder | None = None, marker: SyncMarker | None = None
) -> PacingBidder:
    """A bidder of a plan with 1,000 micro-credits left, synced with the user's open holds
    (the read sent at `marker`, or now)."""
    bidder = bidder or PacingBidder(Budget(total="1", auctions=100, start=START))
    bidder.sync_shared(
        marker=bidder.sync_marker() if marker is None else marker,
        spent_micros=999_000,
        auctions=99,
        window=(START, None),
        now=START,
        held_micros=held_micros,
    )
    return bidder


def test_two_processes_never_bid_the_same_remainder() -> None:
    first = _shared_near_the_end(held_micros=0)
    (bid,) = first.bid([5_000])
    assert bid == 1_000  # the guard caps it at what is left
    # The server holds that bid when the second process reads the ledger: it may still be
    # charged in full, so the second one has nothing to bid until it is settled.
    second = _shared_near_the_end(held_micros=bid)
    assert second.others_in_flight_micros == 1_000
    assert second.bid([5_000]) == [0]
    # Settled uncharged, the hold is gone from the next read: the remainder is free again.
    first.settle("b1", 0, reserved=bid)
    assert _shared_near_the_end(held_micros=0, bidder=second).bid([5_000]) == [1_000]


def test_a_process_does_not_count_its_own_holds_as_the_others() -> None:
    bidder = _shared_near_the_end(held_micros=0)
    (bid,) = bidder.bid([400])
    # The ledger's holds are this process's own bid: nothing is in flight elsewhere.
    _shared_near_the_end(held_micros=bid, bidder=bidder)
    assert bidder.others_in_flight_micros == 0
    assert bidder.available_micros == 1_000 - 400


def test_own_bids_settled_while_the_sync_ran_are_not_taken_off_the_others() -> None:
    bidder = _shared_near_the_end(held_micros=0)
    (bid,) = bidder.bid([400])
    marker = bidder.sync_marker()  # the bid is in flight when the read goes out...
    bidder.settle("b1", 0, reserved=bid)  # ...and settled, uncharged, before its answer
    # So the 700 the ledger holds are another process's, all of them.
    _shared_near_the_end(held_micros=700, bidder=bidder, marker=marker)
    assert bidder.others_in_flight_micros == 700
    assert bidder.available_micros == 300
