"""The rolling auction's order and charges (SPEC section 7) against the brute-force oracle."""

from __future__ import annotations

from fractions import Fraction

from hypothesis import given, settings
from hypothesis import strategies as st

from inference_auctions.server.auction import AuctionRequest, run_auction
from inference_auctions.server.auction.charges import PricingRule
from inference_auctions.server.auction.reference import (
    reference_order,
    reference_rolling_charges,
)
from inference_auctions.server.auction.rolling import (
    HeadPricing,
    RollingRepricer,
    clear_head,
    order_pool,
    rolling_charges,
    settled_rolling_outcome,
)
from tests.auction.strategies import batches

SLOTS = st.sampled_from([2, 3, 8, 64])


def _positive(pool: list[AuctionRequest]) -> list[AuctionRequest]:
    return [request for request in pool if request.bid > 0]


@st.composite
def pools_and_heads(draw: st.DrawFn) -> tuple[list[AuctionRequest], set[str]]:
    """A pool of positive bids and a set of its requests sent to the engine."""
    pool = _positive(draw(batches(max_size=7)))
    head = {r.rid for r in pool if draw(st.booleans())}
    return pool, head


@settings(max_examples=300, deadline=None)
@given(pools_and_heads(), SLOTS)
def test_rolling_charges_equal_the_brute_force_oracle(
    case: tuple[list[AuctionRequest], set[str]], slots: int
) -> None:
    pool, head = case
    ordered = order_pool(pool)
    assert ordered.order == reference_order(pool, [r.bid for r in pool])
    dispatched = [index for index, r in enumerate(pool) if r.rid in head]
    assert rolling_charges(ordered, dispatched, slots) == reference_rolling_charges(
        pool, head, slots
    )


@settings(max_examples=200, deadline=None)
@given(pools_and_heads(), SLOTS)
def test_nobody_pays_more_than_the_bids_it_sent(
    case: tuple[list[AuctionRequest], set[str]], slots: int
) -> None:
    pool, head = case
    ordered = order_pool(pool)
    dispatched = [index for index, r in enumerate(pool) if r.rid in head]
    for user, charge in rolling_charges(ordered, dispatched, slots).items():
        sent = sum(r.bid for r in pool if r.user == user and r.rid in head)
        assert 0 <= charge <= sent


@settings(max_examples=200, deadline=None)
@given(st.builds(_positive, batches(max_size=7)))
def test_a_head_that_is_the_whole_pool_pays_the_fixed_slot_vcg(pool: list[AuctionRequest]) -> None:
    # The whole pool dispatched: the externality on the pool is the batch's own VCG charge.
    rule = PricingRule(slots=64)
    ordered = order_pool(pool)
    charges = rolling_charges(ordered, range(len(pool)), 64)
    assert charges == run_auction(pool, rule).payments


def test_a_late_high_bid_heads_the_pool_and_pays_for_the_backlog_it_jumps() -> None:
    # Ten low bidders wait with fresh prompts; a high bidder arrives last.
    lows = [AuctionRequest(f"low{i}", f"u{i}", [10 + i], 100) for i in range(10)]
    high = AuctionRequest("high", "h", [99], 5_000)
    ordered = order_pool([*lows, high])
    assert ordered.order[0] == 10  # first, whatever it arrived after
    # Sent alone: it delays every low bidder one slot, 10 x 100 / (K-1) = 1000/63.
    assert rolling_charges(ordered, [10], 64) == {"h": 1_000 // 63}
    # With a deep enough backlog the charge stops at the bid.
    deep = [AuctionRequest(f"d{i}", f"d{i}", [1000 + i], 1_000) for i in range(400)]
    ordered = order_pool([*deep, high])
    assert rolling_charges(ordered, [400], 64) == {"h": 5_000}


def _head_pricing(pool: list[AuctionRequest], head: list[int], slots: int) -> HeadPricing:
    ordered = order_pool(pool)
    rank = {index: place for place, index in enumerate(ordered.order)}
    sent = sorted(head, key=rank.__getitem__)
    return HeadPricing(
        order=[pool[i].rid for i in sent],
        users={pool[i].rid: pool[i].user for i in sent},
        bids={pool[i].rid: pool[i].bid for i in sent},
        charges=rolling_charges(ordered, sent, slots),
    )


def test_clear_head_orders_bidders_by_the_pool_and_free_requests_last() -> None:
    pool = [
        AuctionRequest("a", "alice", [1, 2], 10),
        AuctionRequest("b", "bob", [1, 3], 30),
        AuctionRequest("c", "carol", [4], 20),
    ]
    pricing = _head_pricing(pool, [0, 1], 8)
    free = AuctionRequest("z", "zoe", [1, 2, 5], 0)
    rule = PricingRule(slots=8, request_fee_micros=3, rolling=True)
    outcome = clear_head([free, pool[1], pool[0]], pricing, rule)
    # [1] averages 20 and ties [4] at 20; [1] arrived first. Within [1], bob's 30 goes first.
    assert outcome.order == ["b", "a", "z"]
    # Without bob's bid, carol goes first, two slots sooner: 2 x 20 / 7. Without alice's,
    # carol still goes first: she gains 2 x 20, bob loses 1 x 30, and 10 / 7 is left.
    assert outcome.payments == {"zoe": 0, "bob": 40 // 7, "alice": 10 // 7}
    assert outcome.fees == {"zoe": 3, "bob": 3, "alice": 3}
    assert outcome.rule.name == "rolling-slots"


def test_a_request_that_leaves_the_head_takes_its_share_of_the_charge() -> None:
    # alice sends two requests over a backlog of bob's; one of them cannot be settled.
    backlog = [AuctionRequest(f"b{i}", "bob", [50 + i], 100) for i in range(63)]
    pool = [AuctionRequest("a1", "alice", [1], 3_000), AuctionRequest("a2", "alice", [2], 1_000)]
    pricing = _head_pricing([*pool, *backlog], [0, 1], 64)
    # Each of alice's requests delays the 63 backlog requests one slot: 2 x 6300 / 63 = 200.
    assert pricing.charges == {"alice": 200}
    rule = PricingRule(slots=64, rolling=True)
    outcome = clear_head([pool[0]], pricing, rule)
    assert outcome.payments == {"alice": 150}  # a2's share, 1000/4000 of 200, left with it
    assert clear_head(pool, pricing, rule).payments == {"alice": 200}


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.integers(min_value=0, max_value=10**9), min_size=1, max_size=6),
    st.integers(min_value=0, max_value=10**9),
    st.data(),
)
def test_shares_sum_to_the_charge_and_refunds_follow_them(
    bids: list[int], charge: int, data: st.DataObject
) -> None:
    head = [AuctionRequest(f"r{i}", "alice", [i], bid) for i, bid in enumerate(bids)]
    outcome = settled_rolling_outcome(head, list(range(len(head))))
    repricer = RollingRepricer(outcome)
    shares = repricer.shares("alice", charge, outcome.positions)
    assert sum(shares.values()) == charge
    if any(bids):  # in proportion to the bids, within one micro-credit
        for rid, bid in zip(shares, bids, strict=True):
            assert abs(shares[rid] - Fraction(charge * bid, sum(bids))) < 1
    failed = data.draw(st.sets(st.sampled_from(list(shares))))
    refund = repricer.failure_refund("alice", failed, charge)
    assert refund == sum(shares[rid] for rid in failed)
    assert 0 <= refund <= charge
