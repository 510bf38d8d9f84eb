"""The posted price floor's rule (`server.auction.price_floor`): the step is the timing study's
own function, up under a deep pool and down under a shallow one by at most an eighth; an
entrant pays the floor and its rolling charge capped as the study caps them; a delay is counted
in sends since the request was first seen."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from inference_auctions.experiments import timing_model
from inference_auctions.server.auction import price_floor
from inference_auctions.server.auction.price_floor import (
    PostedFloor,
    delay_worth,
    next_floor,
    price_entrants,
)


def test_the_study_and_the_server_step_the_floor_with_one_function() -> None:
    assert timing_model.next_floor is price_floor.next_floor


@given(
    floor=st.integers(0, 10**12),
    depth=st.integers(0, 10_000),
    target=st.integers(1, 1_000),
)
def test_the_floor_rises_under_a_deep_pool_and_falls_under_a_shallow_one_in_bounded_steps(
    floor: int, depth: int, target: int
) -> None:
    after = next_floor(floor, depth, target)
    assert after >= 0
    assert abs(after - floor) <= max(1, floor // 8)  # at most an eighth, at least 1
    if depth > target:
        assert after > floor
    elif depth < target:
        assert after < floor or floor == 0
    else:
        assert after == floor
    # The step grows with the gap up to the target, and no further.
    if depth > 2 * target:
        assert after == next_floor(floor, 2 * target, target)


def test_the_floor_rests_at_zero_while_the_pool_is_shallow_and_rises_from_it_when_deep() -> None:
    assert next_floor(1, 0, 8) == 0 and next_floor(0, 3, 8) == 0
    levels = [0]
    for _ in range(24):  # a pool twice the target: one micro-credit a step until an eighth is more
        levels.append(next_floor(levels[-1], 16, 8))
    assert levels[:10] == list(range(10))
    assert levels[-1] > 24


def test_a_zero_floor_admits_every_positive_bid_and_never_a_zero_one() -> None:
    floor = PostedFloor(0, lambda: 8)
    assert floor.micros == 0 and floor.entry == 1
    assert floor.admits(1) and not floor.admits(0)
    floor.cleared(20, 0, [])
    assert floor.micros == 1 and floor.admits(1) and not floor.admits(0)


@given(st.lists(st.integers(0, 64), max_size=40), st.integers(1, 16), st.integers(1, 10**6))
def test_a_posted_floor_moves_by_the_step_after_every_clearing(
    depths: list[int], target: int, start: int
) -> None:
    floor = PostedFloor(start, lambda: target)
    expected = start
    for depth in depths:
        floor.cleared(depth, 0, [])
        expected = next_floor(expected, depth, target)
        assert floor.micros == expected


@st.composite
def _heads(
    draw: st.DrawFn,
) -> tuple[list[str], dict[str, str], dict[str, int], dict[str, int], int]:
    floor = draw(st.integers(1, 50_000))
    size = draw(st.integers(1, 8))
    order = [f"r{index}" for index in range(size)]
    users = {rid: draw(st.sampled_from(["a", "b", "c"])) for rid in order}
    bids = {rid: draw(st.integers(floor, 200_000)) for rid in order}
    delays = {rid: draw(st.integers(0, 80)) for rid in order}
    worth = {rid: delay_worth(bids[rid], delays[rid], 64) for rid in order}
    return order, users, bids, worth, floor


@given(_heads(), st.data())
def test_an_entrant_pays_floor_and_charge_capped_at_its_delays_worth(
    head: tuple[list[str], dict[str, str], dict[str, int], dict[str, int], int],
    data: st.DataObject,
) -> None:
    order, users, bids, worth, floor = head
    charges = {}
    for user in set(users.values()):
        bid_total = sum(bids[rid] for rid in order if users[rid] == user)
        charges[user] = data.draw(st.integers(0, bid_total))  # the rolling charge, capped at bids
    priced = price_entrants(order, users, worth, charges, floor)
    for user in set(users.values()):
        mine = [rid for rid in order if users[rid] == user]
        total_worth = sum(worth[rid] for rid in mine)
        paid = priced.charges[user] + sum(priced.floors[rid] for rid in mine)
        parts = sum(min(floor, worth[rid]) for rid in mine)
        assert paid == min(charges[user] + parts, total_worth)
        if all(worth[rid] >= floor for rid in mine):
            # The study's charge: min(rolling + floor x entrants sent, their delays' worth).
            assert paid == min(charges[user] + floor * len(mine), total_worth)
        assert paid <= sum(bids[rid] for rid in mine)
        assert 0 <= priced.charges[user] <= charges[user]
    for rid in order:
        assert priced.floors[rid] == min(floor, worth[rid])  # what a failure gives back


def test_a_delay_is_the_sends_since_first_seen_plus_the_place_in_the_head() -> None:
    floor = PostedFloor(100, lambda: 1)
    floor.observe(["early"])
    floor.cleared(1, 0, ["x", "y", "z"])  # three sent while "early" waited
    floor.observe(["early", "late"])
    worth = floor.worth(["late", "early"], {"late": 6_300, "early": 6_300}, 64)
    assert worth == {"late": 6_300, "early": 6_300 * (63 - 4) // 63}
    assert delay_worth(700, 63, 64) == 0  # a bid buys 63 places, and no more
    assert delay_worth(700, 0, 1) == 700
