"""The price floor and the auction outlook against a real server on a real port.

The first tests run on any server: with no floor posted (`--price-floor off`, or a server that
knows none) the client reads it as off and the outlook still answers. The rest need a server
started with `--price-floor posted`; they are skipped, saying so, on a server whose `serve` does
not take it.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from decimal import Decimal

import pytest

from inference_auctions.sdk import (
    AsyncAuctionClient,
    AuctionClient,
    AuctionOutlook,
    BelowFloorWarning,
    Budget,
    NotFoundError,
    PriceFloor,
    format_credits,
)

from .live_server import LiveServer, live_server, serve_takes

# Spend is what the ledger books against the user for its requests.
_SPEND_KINDS = ("charge", "refund", "fee", "floor")


def full_value() -> Budget:
    """A plan that bids every value in full, so that a bid is the value asked about."""
    return Budget(total="100", auctions=1000, pacing="asap")


def check_pool_figures(seen: AuctionOutlook) -> None:
    """The pool's figures, when the server publishes them, hang together."""
    assert seen.entrants is not None and seen.outside is not None
    assert seen.ahead is not None and 0 <= seen.ahead <= seen.entrants
    assert seen.starts_per_second is not None and seen.starts_per_second >= 0
    if seen.clears_floor and seen.starts_per_second > 0:
        assert seen.expected_wait_seconds == seen.ahead / seen.starts_per_second
    else:
        assert seen.expected_wait_seconds is None


# -- any server: no floor posted ----------------------------------------------------------------


@pytest.fixture(scope="module")
def unfloored(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """A server that posts no floor: `--price-floor off` where `serve` takes it (the floor is
    on by default since), else its defaults."""
    options = ("--price-floor", "off") if serve_takes("--price-floor") else ()
    with live_server(tmp_path_factory.mktemp("unfloored"), *options) as server:
        yield server


def test_no_floor_reads_as_off_and_warns_about_nothing(unfloored: LiveServer) -> None:
    _, key = unfloored.new_user(budget_micros=10_000_000, period="day")
    with AuctionClient(unfloored.url, key) as client:
        assert client.market.rule().price_floor == PriceFloor(mode="off")
        # filterwarnings = error: any BelowFloorWarning would fail the request.
        r = client.generate("hi", value="0.000001", max_new_tokens=2)
        assert client.price_floor == PriceFloor(mode="off")
    assert r.auction.bid_micros == 1


@pytest.mark.anyio
async def test_the_outlook_answers_with_no_floor(unfloored: LiveServer) -> None:
    _, key = unfloored.new_user(budget_micros=10_000_000, period="day")
    with AuctionClient(unfloored.url, key) as client:
        seen = client.auction_outlook("0.02")
        held = client.bidder.in_flight_micros
        r = client.generate("hi", value="0.02", max_new_tokens=2)
        try:
            client.market.pool()
            has_pool = True
        except NotFoundError:
            has_pool = False
        again = client.auction_outlook("0.02")
    # The bid is the one the pacing then sent, and nothing was held for the outlook.
    assert (seen.value_micros, seen.bid_micros, held) == (20_000, r.auction.bid_micros, 0)
    assert (seen.price_floor_micros, seen.clears_floor) == (None, True)
    if has_pool:
        check_pool_figures(seen)
    else:
        assert (seen.entrants, seen.ahead, seen.expected_wait_seconds) == (None, None, None)
    assert (again.price_floor_micros, again.clears_floor) == (None, True)
    # The async client shares the implementation: its outlook's bid is its next request's too.
    _, other = unfloored.new_user(budget_micros=10_000_000, period="day")
    plan = Budget(total="10", auctions=100)
    async with AsyncAuctionClient(unfloored.url, other, budget=plan) as aclient:
        aseen = await aclient.auction_outlook("0.02")
        ar = await aclient.generate("hi", value="0.02", max_new_tokens=2)
    assert (aseen.bid_micros, aseen.price_floor_micros) == (ar.auction.bid_micros, None)
    if not has_pool:
        assert (aseen.entrants, aseen.ahead) == (None, None)


# -- a server with a posted floor ---------------------------------------------------------------


@pytest.fixture(scope="module")
def floored(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """A server started with `--price-floor posted` at 100 micro-credits (so that a bid can go
    below it), or a skip on one that predates the floor."""
    if not serve_takes("--price-floor"):
        pytest.skip("this server's `serve` does not accept --price-floor (no posted floor yet)")
    options = ("--price-floor", "posted", "--price-floor-start", "100")
    with live_server(tmp_path_factory.mktemp("floor"), *options) as server:
        yield server


def posted_floor(client: AuctionClient) -> int:
    """The floor in force, at least 2 micro-credits so that a bid can go below it."""
    floor = client.market.rule().price_floor
    assert floor.mode == "posted" and floor.micros is not None, floor
    assert floor.target is not None and floor.target >= 1
    assert floor.micros >= 2, f"the floor fell to {floor.micros}: no positive bid is below it"
    return floor.micros


def test_a_posted_floor_is_read_at_sync(floored: LiveServer) -> None:
    _, key = floored.new_user(budget_micros=100_000_000)
    with AuctionClient(floored.url, key, budget=full_value()) as client:
        floor = posted_floor(client)
        client.generate("hi", value=format_credits(floor * 100), max_new_tokens=2)
        read = client.price_floor
    assert read is not None and read.posted and read.micros is not None and read.micros >= 1


def test_a_bid_below_the_floor_warns_waits_outside_and_pays_nothing(floored: LiveServer) -> None:
    _, key = floored.new_user(budget_micros=100_000_000)
    with AuctionClient(floored.url, key, budget=full_value()) as client:
        client.sync()
        below = posted_floor(client) // 2
        with pytest.warns(BelowFloorWarning, match="below the price floor"):
            r = client.generate("hi", value=format_credits(below), max_new_tokens=2)
        mine = [e for e in client.ledger.iter_entries() if e.rid == r.rid]
    # Sent as paced, not raised to the floor; served when no entrant waited, for nothing.
    assert r.auction.bid_micros == below
    assert r.auction.request_charge_micros == 0 and r.auction.floor_micros == 0
    assert [e for e in mine if e.kind in _SPEND_KINDS and e.amount_micros] == []


def test_floor_charges_count_as_spend_once_per_dispatched_request(floored: LiveServer) -> None:
    _, key = floored.new_user(budget_micros=100_000_000)
    # Synced once, at the start: what the client counts after is its own tally of responses.
    with AuctionClient(floored.url, key, budget=full_value(), sync_interval=None) as client:
        client.sync()
        value = format_credits(posted_floor(client) * 1_000)
        with ThreadPoolExecutor(6) as pool:
            results = list(
                pool.map(lambda _: client.generate("hi", value=value, max_new_tokens=4), range(6))
            )
        counted = client.bidder.spent_micros
        entries = list(client.ledger.iter_entries())
        spend = client.ledger.spend(since=client.bidder.spend_since)
        rows = client.ledger.summary(by="month").rows
        balance = client.ledger.balance()
    booked = -sum(e.amount_micros for e in entries if e.kind in _SPEND_KINDS)
    floors = [e.amount_micros for e in entries if e.kind == "floor"]
    assert floors and all(amount < 0 for amount in floors)  # the entrants paid the floor
    paid = [r.auction.request_charge_micros + r.auction.floor_micros for r in results]
    assert counted == booked == sum(paid)
    assert sum(r.auction.floor_micros for r in results) == -sum(floors)
    assert spend.spent_micros == booked  # the server counts floor entries as spend too
    # The summary names the floors beside the fees, and its rows add up to the balance.
    assert sum(row.floors_micros for row in rows) == -sum(floors)
    assert sum(row.floors for row in rows) == Decimal(-sum(floors)) / 1_000_000
    for row in rows:
        moved = row.granted_micros - row.charged_micros + row.refunded_micros + row.adjusted_micros
        assert row.net_micros == moved - row.fees_micros - row.floors_micros
    assert sum(row.net_micros or 0 for row in rows) == balance.balance_micros


def test_the_outlook_reads_the_pool_under_a_posted_floor(floored: LiveServer) -> None:
    _, key = floored.new_user(budget_micros=100_000_000)
    with AuctionClient(floored.url, key, budget=full_value()) as client:
        floor = posted_floor(client)
        above = client.auction_outlook(format_credits(floor * 100))
        below = client.auction_outlook(format_credits(floor // 2))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", BelowFloorWarning)
            pool = client.market.pool(bid=floor // 2)
    assert above.clears_floor and above.price_floor_micros is not None
    check_pool_figures(above)
    assert not below.clears_floor and below.expected_wait_seconds is None
    assert pool.price_floor_micros is not None and pool.ahead is not None


def test_the_floor_detection_reads_the_servers_own_options() -> None:
    # The skip above must not hide the floor tests on a server that has the option.
    assert serve_takes("--pricing-rule")
    assert not serve_takes("--no-such-option")
