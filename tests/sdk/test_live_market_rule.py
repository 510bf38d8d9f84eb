"""`GET /v1/market/rule` on a real server: the pricing rule a bidder reads before bidding."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from inference_auctions.sdk import AsyncAuctionClient, AuctionClient, MarketRule

from .live_server import LiveServer, live_server


@pytest.mark.anyio
async def test_the_rule_is_published_as_the_settings_give_it(live: LiveServer) -> None:
    _, key = live.new_user()
    with AuctionClient(live.url, key) as client:
        rule = client.market.rule()
    # The server's defaults: the rolling auction's fixed slots, as many as the batch size (8
    # here), no fee, and the posted floor at rest (0) aiming at the engine's next step (the
    # batch size here).
    assert rule.model_dump() == {
        "pricing_rule": "rolling-slots",
        "priority_slots": 8,
        "batch_size": 8,
        "request_fee_micros": 0,
        "pricing": "auction",
        "price_floor": {"mode": "posted", "micros": 0, "target": 8},
    }

    async def read() -> MarketRule:
        async with AsyncAuctionClient(live.url, key) as client:
            return await client.market.rule()

    assert (await read()).model_dump() == rule.model_dump()
    assert httpx.get(live.url + "/v1/market/rule").status_code == 401


def test_other_settings_publish_their_own_rule(tmp_path: Path) -> None:
    (tmp_path / "slots").mkdir()
    (tmp_path / "paper").mkdir()
    with live_server(tmp_path / "slots", priority_slots=24) as server:
        _, key = server.new_user()
        with AuctionClient(server.url, key) as client:
            assert client.market.rule().priority_slots == 24
    with live_server(tmp_path / "paper", pricing_rule="batch-size") as server:
        _, key = server.new_user()
        with AuctionClient(server.url, key) as client:
            published = client.market.rule()
    assert (published.pricing_rule, published.priority_slots) == ("batch-size", None)
