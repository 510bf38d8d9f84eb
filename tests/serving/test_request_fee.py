"""The request fee on a real server (docs/SPEC.md section 5): every request, zero bids included,
pays it once beside its VCG charge; it is held with the bid, a budget that cannot cover both is
refused with a 402 that names the fee, the rule's figures publish it, and replicas that
disagree on it refuse to start."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Iterator

import httpx
import pytest

from inference_auctions.sdk import AuctionClient, Budget, BudgetExhaustedError
from inference_auctions.server.app import create_app
from inference_auctions.server.settings import ServerSettings
from inference_auctions.server.start_refusal import StartRefused
from tests.db_fixtures import MigratedDatabase
from tests.server.harness import TEST_SETTINGS, RunningServer, running_server, serve_app

FEE = 5_000


@pytest.fixture
def server(ledger_db: MigratedDatabase) -> Iterator[RunningServer]:
    """A server whose every request pays `FEE`."""
    with running_server(ledger_db, request_fee_micros=FEE, replica_name="fee") as running:
        yield running


def _spent(server: RunningServer, name: str) -> dict[str, int]:
    totals: dict[str, int] = defaultdict(int)
    for entry in server.ledger.entries(name, limit=1000).entries:
        if entry.kind in ("charge", "refund", "fee"):
            totals[str(entry.kind)] -= entry.amount_micros
    return dict(totals)


@pytest.mark.anyio
async def test_every_served_request_pays_the_fee_once_and_no_more_than_bid_plus_fee(
    ledger_db: MigratedDatabase,
) -> None:
    # A batch closes once its 3 requests wait: they share one auction (the free one too, which
    # `free_traffic idle` would send only after the paying ones).
    with running_server(
        ledger_db, request_fee_micros=FEE, batch_size=3, max_wait_ms=5_000, free_traffic="shared"
    ) as server:
        await _one_batch_with_fees(server)


async def _one_batch_with_fees(server: RunningServer) -> None:
    keys = {name: server.create_user(name, budget=1_000_000) for name in ("alice", "bob")}
    sent = [("alice", "a1", "0.2"), ("bob", "b1", "0.1"), ("alice", "a0", "0")]

    async def batch() -> list[httpx.Response]:
        clients = {name: server.async_client(key) for name, key in keys.items()}
        try:
            return list(
                await asyncio.gather(
                    *(
                        clients[name].post(
                            "/generate",
                            json={"rid": rid, "text": f"shared prompt {rid}", "bid": bid},
                        )
                        for name, rid, bid in sent
                    )
                )
            )
        finally:
            for client in clients.values():
                await client.aclose()

    responses = await batch()
    assert [r.status_code for r in responses] == [200, 200, 200], responses[0].text
    auctions = [r.json()["meta_info"]["auction"] for r in responses]
    assert len({a["batch_id"] for a in auctions}) == 1
    assert [a["request_fee_micros"] for a in auctions] == [FEE, FEE, FEE]
    for name, bids in (("alice", 200_000), ("bob", 100_000)):
        requests = sum(1 for user, _, _ in sent if user == name)
        charge = next(
            a["user_batch_charge_micros"]
            for a, (user, _, _) in zip(auctions, sent, strict=True)
            if user == name
        )
        spent = _spent(server, name)
        # The fee once per request, beside the charge (no charge entry for a charge of 0).
        assert (spent.get("charge", 0), spent["fee"]) == (charge, requests * FEE)
        assert set(spent) <= {"charge", "fee"}
        # Individual rationality with the announced fee: nobody pays more than bids plus fees.
        assert sum(spent.values()) <= bids + requests * FEE
        balance = server.ledger.balance(name)
        assert balance.balance_micros == 1_000_000 - sum(spent.values())
        assert balance.held_micros == 0
    assert server.ledger.reconcile().ok
    with server.client(keys["bob"]) as client:
        rule = client.get("/v1/market/rule").json()
        budget = client.get("/v1/budget").json()
        prices = client.get("/v1/market/prices").json()
    assert rule["request_fee_micros"] == budget["request_fee_micros"] == FEE
    assert prices["request_fee_micros"] == FEE
    assert budget["spent_micros"] == sum(_spent(server, "bob").values())
    # The dashboard: the operator sees the fees settled, a user the fee each request paid.
    root = server.create_user("root", budget=0, admin=True)
    with httpx.Client(base_url=server.url, timeout=60) as client:
        for key in (root, keys["alice"]):
            signed = client.post(
                "/v1/dashboard/session", headers={"Authorization": f"Bearer {key}"}
            )
            assert signed.status_code == 200, signed.text
            if key == root:
                market = client.get("/v1/dashboard/market").json()
        account = client.get("/v1/dashboard/account").json()
    assert market["totals"]["fees_micros"] == 3 * FEE
    assert market["request_fee_micros"] == FEE
    assert [r["request_fee_micros"] for r in account["recent"]] == [FEE, FEE]


def test_a_budget_short_of_bid_plus_fee_is_refused_naming_the_fee(server: RunningServer) -> None:
    exact = server.create_user("exact", budget=100_000)
    broke = server.create_user("broke", budget=0)
    with server.client(exact) as client:
        refused = client.post("/generate", json={"text": "hi", "bid": "0.1"})
        assert refused.status_code == 402, refused.text
        error = refused.json()["error"]
        assert error["param"] == "bid"
        assert "plus the request fee of 0.005 credits" in error["message"]
        # What is left pays a smaller bid and the fee: a zero bid costs the fee alone.
        served = client.post("/generate", json={"text": "hi", "bid": "0.095", "rid": "ok"})
        assert served.status_code == 200, served.text
    with server.client(broke) as client:
        free = client.post("/generate", json={"text": "hi"})  # a zero bid is not free
        assert free.status_code == 402, free.text
        assert "request fee" in free.json()["error"]["message"]
    assert server.ledger.balance("exact").balance_micros >= 0
    assert _spent(server, "broke") == {}
    assert server.ledger.reconcile().ok


@pytest.mark.anyio
async def test_replicas_that_disagree_on_the_fee_refuse_to_start(
    ledger_db: MigratedDatabase,
) -> None:
    def settings(name: str, fee: int) -> ServerSettings:
        return ServerSettings(
            database_url=ledger_db.url,
            **{**TEST_SETTINGS, "replica_name": name, "request_fee_micros": fee},
        )

    async def start(name: str, fee: int) -> None:
        """Start a replica's app and stop it again (what `serve` does before it listens)."""
        app = create_app(settings(name, fee))
        async with app.router.lifespan_context(app):
            pass

    with serve_app(settings("r0", FEE)):
        with pytest.raises(StartRefused, match=r"'r0'.*request fee of 5000"):
            await start("r1", 0)
        await start("r1", FEE)  # the same fee: it joins
    await start("r1", 0)  # every replica stopped: the fee may change


def test_the_sdk_guard_never_overspends_with_a_fee(server: RunningServer) -> None:
    key = server.create_user("paced", budget=1_000_000)
    budget = 40_000  # eight fees, or fewer requests with bids
    sent = 0
    with AuctionClient(
        base_url=server.url, api_key=key, budget=Budget(total="0.04", auctions=5)
    ) as client:
        assert client.market.rule().request_fee_micros == FEE
        with pytest.raises(BudgetExhaustedError, match="fee"):
            for index in range(20):
                result = client.generate(f"question {index}", value="0.02", max_new_tokens=2)
                assert result.auction.request_fee_micros == FEE
                sent += 1
        spent = client.bidder.spent_micros
    ledger = sum(_spent(server, "paced").values())
    assert 0 < sent < 20
    assert _spent(server, "paced")["fee"] == sent * FEE
    assert ledger == spent <= budget
    assert server.ledger.reconcile().ok
