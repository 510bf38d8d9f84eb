"""Choosing a tier by expected gain, and sending through one, against a real tiers server."""

from __future__ import annotations

from pathlib import Path

import pytest

from inference_auctions.sdk import (
    AuctionClient,
    BadRequestError,
    Tier,
    TierMenu,
    choose_tier,
    expected_gain_micros,
)

from .live_server import live_server

MENU = TierMenu(
    default_tier="flex",
    tiers=[
        Tier(name="priority", price_micros=10_000, rank=0, expected_priority_ppm=900_000),
        Tier(name="default", price_micros=1_000, rank=1, expected_priority_ppm=500_000),
        Tier(name="flex", price_micros=0, rank=2, expected_priority_ppm=100_000),
    ],
)


def test_the_tier_of_largest_expected_gain_is_chosen() -> None:
    # gain = value x priority - price: flex 0.1 v, default 0.5 v - 1000, priority 0.9 v - 10000.
    assert choose_tier(0, MENU).name == "flex"
    assert choose_tier("0.002", MENU).name == "flex"  # 200 against 0 and -9 ...
    assert choose_tier("0.003", MENU).name == "default"  # 500 against 300
    assert choose_tier("0.03", MENU).name == "priority"  # 17000 against 14000
    assert expected_gain_micros("0.03", MENU.tiers[0]) == 17_000
    # The cheaper on a tie: at value 0.0025, flex and default both gain 250.
    assert choose_tier("0.0025", MENU).name == "flex"
    # A budget that cannot cover a tier leaves it out; none covered: the cheapest.
    assert choose_tier("0.03", MENU, available_micros=5_000).name == "default"
    assert choose_tier("0.03", MENU, available_micros=-1).name == "flex"
    with pytest.raises(ValueError, match="value"):
        choose_tier("-1", MENU)


def test_a_client_reads_the_tiers_and_pays_the_tier_it_chose(tmp_path: Path) -> None:
    tiers = "flex=0,default=0.001,priority=0.01"
    with live_server(tmp_path, pricing="tiers", tiers=tiers) as server:
        _, key = server.new_user(budget_micros=1_000_000, period="day")
        with AuctionClient(server.url, key) as client:
            assert client.market.rule().pricing == "tiers"
            menu = client.market.tiers()
            client.sync()  # the budget's figures, before the first request
            assert [t.name for t in menu.tiers] == ["priority", "default", "flex"]
            tier = choose_tier("1", menu, available_micros=client.bidder.available_micros)
            assert tier.name == "priority"  # worth far more than its price
            reply = client.generate(
                "Hello", value=0, max_new_tokens=4, extra_body={"service_tier": tier.name}
            )
            assert reply.auction.request_charge_micros == 10_000
            assert client.bidder.spent_micros == 10_000  # the pacer counts what tiers cost
            with pytest.raises(BadRequestError, match="sells fixed-price tiers"):
                client.generate("Hello", value="0.5", max_new_tokens=4)
            assert client.ledger.balance().balance_micros == 990_000
