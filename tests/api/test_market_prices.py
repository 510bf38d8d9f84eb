"""`GET /v1/market/prices` from an aggregate in memory: the bands mean what docs/SDK.md says,
no answer reveals one user's batch, and its cost is limited per key.

Each test ends with an audit of the money against the answers.
"""

from __future__ import annotations

import asyncio

import httpx
import pytest

from inference_auctions.server.api import market_prices
from tests.db_fixtures import MigratedDatabase
from tests.server.harness import RunningServer, running_server
from tests.server.money_audit import audit_money_against_answers

_USERS = ("u1", "u2", "u3")


async def _contested_batches(server: RunningServer, keys: dict[str, str], count: int) -> list[str]:
    """`count` batches of three users bidding 3, 2 and 1 credits (each on top in turn); their
    ledger rids."""

    async def one(round_: int) -> None:
        async with (
            server.async_client(keys["u1"]) as a,
            server.async_client(keys["u2"]) as b,
            server.async_client(keys["u3"]) as c,
        ):
            bids = ("3", "2", "1")[round_ % 3 :] + ("3", "2", "1")[: round_ % 3]
            sent = [
                client.post(
                    "/generate", json={"rid": f"c{round_}", "text": f"{n} {round_}", "bid": bid}
                )
                for client, n, bid in zip((a, b, c), _USERS, bids, strict=True)
            ]
            assert [r.status_code for r in await asyncio.gather(*sent)] == [200] * 3

    for round_ in range(count):
        await one(round_)
    return [f"{name}/c{r}" for r in range(count) for name in _USERS]


@pytest.mark.anyio
async def test_lone_batches_do_not_drag_the_top_band_and_one_batch_reveals_nothing(
    ledger_db: MigratedDatabase,
) -> None:
    # Before: a user's only request in a batch of one (priority 1, charge 0) counted in the top
    # band, so six lone requests made its median 0; and max_batches=1 showed one batch's users.
    with running_server(ledger_db, batch_size=3, max_wait_ms=300) as server:
        keys = {name: server.create_user(name) for name in (*_USERS, "lone")}
        rids = await _contested_batches(server, keys, 3)
        with server.client(keys["lone"]) as client:
            for i in range(6):
                body = {"rid": f"l{i}", "text": f"alone {i}", "bid": "1"}
                assert client.post("/generate", json=body).status_code == 200
            table = client.get("/v1/market/prices").json()
            top = table["by_priority"][0]
            assert top["samples"] == 3  # the contested top places only
            assert top["median_charge_micros"] is not None and top["median_charge_micros"] > 0
            one = client.get("/v1/market/prices", params={"max_batches": 1}).json()
            assert one["charge_per_priority_micros"] == {
                "mean": None,
                "p10": None,
                "p50": None,
                "p90": None,
            }
            assert all(band["median_charge_micros"] is None for band in one["by_priority"])
        outcomes = dict.fromkeys(rids, "served") | {f"lone/l{i}": "served" for i in range(6)}
        audit_money_against_answers(server.ledger, outcomes)


@pytest.mark.anyio
async def test_a_flood_of_price_questions_costs_its_own_key(
    ledger_db: MigratedDatabase, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A budget of computing time so small that one computed answer spends it.
    monkeypatch.setattr(market_prices, "_COST_BURST", 1e-9)
    monkeypatch.setattr(market_prices, "_COST_RATE", 1e-9)
    with running_server(ledger_db, batch_size=3, max_wait_ms=300) as server:
        keys = {name: server.create_user(name) for name in (*_USERS, "flood", "other")}
        rids = await _contested_batches(server, keys, 1)
        with server.client(keys["flood"]) as flood, server.client(keys["other"]) as other:
            statuses = [
                flood.get("/v1/market/prices", params={"window_seconds": 60 * (i + 1)}).status_code
                for i in range(5)
            ]
            assert statuses[0] == 200 and set(statuses[1:]) == {429}
            refused = flood.get("/v1/market/prices", params={"window_seconds": 7200})
            assert refused.status_code == 429 and int(refused.headers["Retry-After"]) >= 1
            # A question already answered is kept, and costs nothing.
            assert flood.get("/v1/market/prices", params={"window_seconds": 60}).status_code == 200
            # Another key is not held back by the flood.
            answer = other.get("/v1/market/prices", params={"window_seconds": 86_400})
            assert answer.status_code == 200 and answer.json()["batches"] == 1
        audit_money_against_answers(server.ledger, dict.fromkeys(rids, "served"))
        assert isinstance(httpx.get(f"{server.url}/health").status_code, int)
