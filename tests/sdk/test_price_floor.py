"""The posted price floor in the client: read at each sync, a warning for a bid below it, the
auction outlook, and floor charges counted as spend once per request (against a fake server)."""

from __future__ import annotations

import json
import logging
import warnings
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from decimal import Decimal
from fractions import Fraction
from typing import Any

import pytest

from inference_auctions.sdk import (
    AsyncAuctionClient,
    AuctionClient,
    AuctionOutlook,
    BelowFloorWarning,
    Budget,
    MarketRule,
    PacingBidder,
    PriceFloor,
)

from .conftest import BASE_URL, async_transport, transport
from .fake_server import API_KEY, FakeServer, error_response

pytestmark = pytest.mark.usefixtures("fast_retries")

FLOOR = 5_000
POOL = {"price_floor_micros": FLOOR, "entrants": 12, "outside": 3, "ahead": 6}


def rule_body(floor: int | None = FLOOR, **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "pricing_rule": "rolling-slots",
        "priority_slots": 8,
        "batch_size": 8,
        "request_fee_micros": 0,
        "pricing": "auction",
        **extra,
    }
    if floor is not None:
        body["price_floor"] = {"mode": "posted", "micros": floor, "target": 8}
    return body


def make_client(server: FakeServer, **kwargs: Any) -> AuctionClient:
    # Full value by default, so that a bid is the value asked for.
    kwargs.setdefault("budget", Budget(total="50", auctions=1000, pacing="asap"))
    return AuctionClient(BASE_URL, API_KEY, transport=transport(server), **kwargs)


def make_async_client(server: FakeServer, **kwargs: Any) -> AsyncAuctionClient:
    kwargs.setdefault("budget", Budget(total="50", auctions=1000, pacing="asap"))
    return AsyncAuctionClient(BASE_URL, API_KEY, transport=async_transport(server), **kwargs)


def sent_bids(server: FakeServer) -> list[str]:
    return [json.loads(r.content)["bid"] for r in server.attempts_on("/generate")]


def floor_warnings(record: list[warnings.WarningMessage]) -> list[warnings.WarningMessage]:
    return [w for w in record if issubclass(w.category, BelowFloorWarning)]


# -- reading the floor --------------------------------------------------------------------------


def test_the_floor_is_read_with_every_sync_and_exposed(server: FakeServer) -> None:
    server.rule = rule_body(FLOOR)
    with make_client(server) as client:
        assert client.price_floor is None  # nothing read before the first sync
        client.generate("hi", value="0.02")
        floors = [client.price_floor]
        server.rule = rule_body(7_000)
        client.sync()
        floors.append(client.price_floor)
        # A clone made by with_options sees the same floor, read by either.
        clone = client.with_options(max_retries=0)
        server.rule = rule_body(9_000)
        clone.sync()
        floors.append(client.price_floor)
    assert floors == [PriceFloor(mode="posted", micros=m, target=8) for m in (5_000, 7_000, 9_000)]
    assert floors[0] is not None and floors[0].floor == Decimal("0.005")
    assert len(server.attempts_on("/v1/market/rule")) == 3
    assert len(server.attempts_on("/v1/spend")) == 3


@pytest.mark.parametrize(
    "rule",
    [
        rule_body(None),  # a server from before floors: no field
        rule_body(None, price_floor=None),
        rule_body(None, price_floor={"mode": "off", "micros": None, "target": None}),
        None,  # no rule route at all (404)
    ],
)
def test_a_server_without_a_floor_reads_as_off(
    server: FakeServer, rule: dict[str, Any] | None
) -> None:
    server.rule = rule
    with make_client(server) as client, warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        client.generate("hi", value="0.000001")
        assert client.price_floor == PriceFloor(mode="off")
        assert client.price_floor.floor is None
        assert not client.price_floor.posted
    assert floor_warnings(record) == []
    if rule is not None:
        assert MarketRule.model_validate(rule).price_floor.mode == "off"


def test_a_failed_floor_read_keeps_the_last_floor_and_fails_no_request(
    server: FakeServer, caplog: pytest.LogCaptureFixture
) -> None:
    server.rule = rule_body(FLOOR)
    with make_client(server, sync_interval=0.001) as client:
        client.generate("hi", value="0.02")
        server.queue("/v1/market/rule", *[error_response(500, "internal_error")] * 3)
        with caplog.at_level(logging.WARNING, logger="inference_auctions.sdk"):
            client.sync()
            r = client.generate("hi", value="0.02")
    assert r.auction.bid_micros == 20_000
    assert client.price_floor is not None and client.price_floor.micros == FLOOR
    assert "reading the price floor failed" in caplog.text


# -- the warning --------------------------------------------------------------------------------


def test_a_bid_below_the_floor_warns_once_per_value_and_still_goes_out(
    server: FakeServer,
) -> None:
    server.rule = rule_body(FLOOR)
    with make_client(server) as client:
        with pytest.warns(
            BelowFloorWarning, match=r"0\.003000 is below the price floor of 0\.005000"
        ):
            client.generate("hi", value="0.003")
        with warnings.catch_warnings(record=True) as record:
            warnings.simplefilter("always")
            client.generate("hi", value="0.003")  # the same value: warned already
            client.generate("hi", value="0.006")  # above the floor
            client.generate("hi", value="0.005")  # at the floor: it enters
            client.generate("hi", value=0)  # asks only for the room bidders leave
            client.chat([{"role": "user", "content": "hi"}], value="0.004")
        (warned,) = floor_warnings(record)
    assert "value of 0.004000" in str(warned.message)
    # The warning points at the caller's line, not into the client.
    assert warned.filename == __file__
    # What goes out is the paced bid, below the floor or not: the user's call.
    assert sent_bids(server) == ["0.003000", "0.003000", "0.006000", "0.005000", "0.000000"]


def test_the_warning_judges_the_paced_bid_not_the_value(server: FakeServer) -> None:
    server.rule = rule_body(FLOOR)
    # A value above the floor, capped below it.
    capped = r"bid of 0\.001000 credits for a value of 0\.010000"
    with make_client(server) as client, pytest.warns(BelowFloorWarning, match=capped):
        client.generate("hi", value="0.01", max_bid="0.001")
    # A budget that leaves 0.002 scales the bid for the same value down below the floor.
    small = Budget(total="0.002", auctions=1000, pacing="asap")
    other = FakeServer()
    other.rule = rule_body(FLOOR)
    scaled = r"bid of 0\.002000 credits"
    with make_client(other, budget=small) as client, pytest.warns(BelowFloorWarning, match=scaled):
        client.generate("hi", value="0.01")


def test_a_warning_made_an_error_sends_nothing_and_holds_nothing(server: FakeServer) -> None:
    server.rule = rule_body(FLOOR)
    with make_client(server) as client, warnings.catch_warnings():
        warnings.simplefilter("error", BelowFloorWarning)
        with pytest.raises(BelowFloorWarning):
            client.generate("hi", value="0.003")
        assert client.bidder.in_flight_micros == 0
    assert server.attempts_on("/generate") == []


# -- the outlook --------------------------------------------------------------------------------


def test_the_outlook_reads_the_pool_for_the_bid_the_pacing_would_send(server: FakeServer) -> None:
    server.rule = rule_body(FLOOR)
    server.pool = {**POOL, "starts_per_second": 4.0}
    with make_client(server) as client:
        seen = client.auction_outlook("0.02")
        below = client.auction_outlook("0.003")
        assert client.bidder.in_flight_micros == 0  # nothing reserved, nothing sent
    assert server.attempts_on("/generate") == []
    assert [r.url.params["bid"] for r in server.attempts_on("/v1/market/pool")] == ["20000", "3000"]
    assert seen == AuctionOutlook(
        value_micros=20_000,
        bid_micros=20_000,
        price_floor_micros=FLOOR,
        clears_floor=True,
        entrants=12,
        outside=3,
        ahead=6,
        starts_per_second=4.0,
        expected_wait_seconds=1.5,
    )
    assert (seen.value, seen.bid, seen.price_floor) == (
        Decimal("0.02"),
        Decimal("0.02"),
        Decimal("0.005"),
    )
    # Below the floor the request waits until no entrant does: no wait can be promised.
    assert (below.clears_floor, below.expected_wait_seconds) == (False, None)


def test_the_outlook_bid_is_the_next_request_bid(server: FakeServer) -> None:
    server.pool = {**POOL, "starts_per_second": 4.0}
    # A tight plan charged in full: the multiplier moves, and the bid is not the value.
    with make_client(server, budget=Budget(total="0.05", auctions=10)) as client:
        for _ in range(3):
            client.generate("hi", value="0.02")
        seen = client.auction_outlook("0.02")
        r = client.generate("hi", value="0.02")
    assert 0 < seen.bid_micros < 20_000
    assert r.auction.bid_micros == seen.bid_micros


def test_the_outlook_without_the_pool_route_says_what_it_knows(server: FakeServer) -> None:
    server.rule = rule_body(FLOOR)
    with make_client(server) as client:
        seen = client.auction_outlook("0.02")
        assert client.price_floor is not None and client.price_floor.micros == FLOOR
        server.rule = None  # nor the rule: no floor known
        bare = client.auction_outlook("0.02")
        zero = client.auction_outlook(0)
    assert seen == AuctionOutlook(
        value_micros=20_000, bid_micros=20_000, price_floor_micros=FLOOR, clears_floor=True
    )
    assert (seen.entrants, seen.ahead, seen.expected_wait_seconds) == (None, None, None)
    assert (bare.price_floor_micros, bare.clears_floor) == (None, True)
    assert zero.clears_floor is False  # a zero bid never enters the auction


def test_the_outlook_with_no_starts_has_no_wait_and_takes_the_pool_floor(
    server: FakeServer,
) -> None:
    server.rule = rule_body(FLOOR)
    server.pool = {**POOL, "price_floor_micros": 6_000, "starts_per_second": 0.0}
    with make_client(server) as client:
        client.sync()
        seen = client.auction_outlook("0.02")
        # The pool's fresher level replaces the synced one; the target read with it stays.
        assert client.price_floor == PriceFloor(mode="posted", micros=6_000, target=8)
        server.pool = {**POOL, "price_floor_micros": None, "starts_per_second": 2.0}
        off = client.auction_outlook("0.000001")
        assert client.price_floor == PriceFloor(mode="off")
    assert (seen.ahead, seen.expected_wait_seconds) == (6, None)
    assert (off.price_floor_micros, off.clears_floor, off.expected_wait_seconds) == (
        None,
        True,
        3.0,
    )


@pytest.mark.anyio
async def test_the_async_outlook_answers_as_the_sync_one(server: FakeServer) -> None:
    server.rule = rule_body(FLOOR)
    server.pool = {**POOL, "starts_per_second": 4.0}
    with make_client(server) as client:
        expected = [client.auction_outlook(v) for v in ("0.02", "0.003")]
    async with make_async_client(server) as aclient:
        got = [await aclient.auction_outlook(v) for v in ("0.02", "0.003")]
        server.pool = None
        expected_bare = AuctionOutlook(
            value_micros=20_000, bid_micros=20_000, price_floor_micros=FLOOR, clears_floor=True
        )
        assert await aclient.auction_outlook("0.02") == expected_bare
        assert aclient.price_floor is not None and aclient.price_floor.micros == FLOOR
        with pytest.warns(BelowFloorWarning):
            await aclient.generate("hi", value="0.003")
    assert got == expected


# -- floor charges as spend ---------------------------------------------------------------------


def test_floor_charges_count_as_spend_once_per_dispatched_request() -> None:
    # Three requests in one clearing: two pay the floor and half the rest of their bid, one
    # below the floor pays nothing.
    server = FakeServer(batch_size=3, floor=FLOOR, charge_share=Fraction(1, 2), wait=5.0)
    server.rule = rule_body(FLOOR)
    with make_client(server, sync_interval=None) as client:
        client.sync()
        values = ["0.02", "0.01", "0.003"]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", BelowFloorWarning)
            with ThreadPoolExecutor(3) as pool:
                results = list(pool.map(lambda v: client.generate("hi", value=v), values))
        charges = [r.auction.request_charge_micros for r in results]
        assert charges == [5_000 + 7_500, 5_000 + 2_500, 0]
        assert {r.auction.batch_id for r in results} == {"batch-0"}
        booked = -sum(e.amount_micros for e in client.ledger.iter_entries())
        floors = [e for e in client.ledger.iter_entries() if e.kind == "floor"]
        # Counted as the ledger books it, floor entries included, each request once.
        assert client.bidder.spent_micros == sum(charges) == booked == 20_000
        assert client.bidder.auctions == 1
        assert sorted((e.rid, e.amount_micros) for e in floors) == sorted(
            [(results[0].rid, -FLOOR), (results[1].rid, -FLOOR)]
        )
        # The ledger's figure, read back, agrees: nothing was counted twice.
        client.sync()
        assert client.bidder.spent_micros == 20_000


# -- the pacing's preview -----------------------------------------------------------------------


def test_a_preview_is_the_next_bid_and_reserves_nothing() -> None:
    now = datetime(2030, 1, 1, tzinfo=UTC)
    bidder = PacingBidder(Budget(total="0.1", auctions=100), clock=now.timestamp)
    # Joining a plan in progress: the slow start's first bid is the target itself.
    bidder.sync_shared(
        marker=bidder.sync_marker(),
        spent_micros=50_000,
        auctions=50,
        window=(now, None),
        now=now,
    )
    first = bidder.preview(20_000)
    assert first == bidder.preview(20_000) == 1_000  # (100000 - 50000) / (100 - 50)
    assert bidder.in_flight_micros == 0
    assert bidder.bid([20_000]) == [first]
    assert bidder.preview(20_000, max_bid=400) == 400
    with pytest.raises(ValueError, match="negative"):
        bidder.preview(-1)
