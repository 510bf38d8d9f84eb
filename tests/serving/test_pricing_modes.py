"""The pricing modes of one server (`--pricing tiers|fcfs`), end to end: a real server on a real
port, the ledger on SQLite and PostgreSQL, every money assertion checked against the ledger."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from pydantic import ValidationError

from inference_auctions.billing import BatchInput, Ledger, RequestInput, RuleDisagreement
from inference_auctions.server.cluster.rule_agreement import RuleAgreement
from inference_auctions.server.emulator.embedded import EmbeddedEngine
from inference_auctions.server.engine.errors import EngineUnavailable
from inference_auctions.server.engine.protocol import Generation
from inference_auctions.server.serving.clearing import refund_rule
from inference_auctions.server.settings import ServerSettings
from tests.db_fixtures import MigratedDatabase
from tests.processes import free_port
from tests.server.harness import TEST_SETTINGS, RunningServer, running_server, serve_app

TIERS = {"pricing": "tiers", "tiers": "flex=0,default=0.001,priority=0.01"}
PRICES = {"flex": 0, "default": 1_000, "priority": 10_000}
BUDGET = 1_000_000


def _ledger_spend(server: RunningServer, user: str) -> int:
    entries = server.ledger.entries(user, limit=1000).entries
    return sum(-e.amount_micros for e in entries if e.kind in ("charge", "refund"))


def _post(client: httpx.Client, body: dict[str, Any], path: str = "/generate") -> httpx.Response:
    return client.post(path, json={"sampling_params": {"max_new_tokens": 4}, **body})


def test_tiers_charge_exactly_the_tier_price(ledger_db: MigratedDatabase) -> None:
    with running_server(ledger_db, **TIERS) as server:
        key = server.create_user("alice", budget=BUDGET)
        with server.client(key) as client:
            sent = {"priority": 3, "default": 2, "flex": 1, None: 1, "auto": 1}
            for tier, count in sent.items():
                for index in range(count):
                    body = {"text": f"Question {tier} {index}?"}
                    if tier is not None:
                        body["service_tier"] = tier
                    response = _post(client, body)
                    assert response.status_code == 200, response.text
                    auction = response.json()["meta_info"]["auction"]
                    served = tier if tier not in (None, "auto") else "flex"  # the default
                    assert auction["pricing"] == "tiers"
                    assert auction["service_tier"] == served
                    assert auction["request_charge_micros"] == PRICES[served]
                    assert auction["bid_micros"] == PRICES[served]
            # OpenAI's field on OpenAI's route.
            chat = client.post(
                "/v1/chat/completions",
                json={
                    "messages": [{"role": "user", "content": "Hi"}],
                    "max_tokens": 4,
                    "service_tier": "priority",
                },
            )
            assert chat.status_code == 200, chat.text
            assert chat.json()["auction"]["request_charge_micros"] == PRICES["priority"]
            menu = client.get("/v1/market/tiers").json()
            rule = client.get("/v1/market/rule").json()
        expected = 4 * PRICES["priority"] + 2 * PRICES["default"]
        assert _ledger_spend(server, "alice") == expected
        balance = server.ledger.balance("alice")
        assert balance.balance_micros == BUDGET - expected and balance.held_micros == 0
        assert server.ledger.reconcile().ok
        assert [t["name"] for t in menu["tiers"]] == ["priority", "default", "flex"]
        assert [t["price_micros"] for t in menu["tiers"]] == [10_000, 1_000, 0]
        assert menu["default_tier"] == "flex"
        assert all(0 <= t["expected_priority_ppm"] <= 1_000_000 for t in menu["tiers"])
        assert all(t["recent_wait_ms"] >= 0 for t in menu["tiers"])
        assert rule["pricing"] == "tiers" and rule["pricing_rule"] == "tiers"
        admin = server.create_user("root", budget=0, admin=True)
        with httpx.Client(base_url=server.url, timeout=60) as dashboard:
            signed = dashboard.post(
                "/v1/dashboard/session", headers={"Authorization": f"Bearer {admin}"}
            )
            assert signed.status_code == 200
            pricing = dashboard.get("/v1/dashboard/market").json()["pricing"]
        assert pricing["mode"] == "tiers"
        assert [(t["name"], t["price_micros"]) for t in pricing["tiers"]] == list(PRICES.items())[
            ::-1
        ]
        metrics = httpx.get(server.url + "/metrics").text
        assert 'inference_auction_pricing_mode{mode="tiers"} 1.0' in metrics
        assert 'inference_auction_tier_requests_total{tier="priority"} 4.0' in metrics


def test_a_request_the_tiers_server_cannot_price_is_a_400_naming_the_field(
    ledger_db: MigratedDatabase,
) -> None:
    with running_server(ledger_db, **TIERS) as server:
        key = server.create_user("bob", budget=BUDGET)
        with server.client(key) as client:
            cases = [
                ({"text": "x", "service_tier": "gold"}, "service_tier", "'gold' is not a tier"),
                ({"text": "x", "service_tier": 3}, "service_tier", "expected a tier's name"),
                ({"text": "x", "bid": "0.5"}, "bid", "sells fixed-price tiers"),
                ({"text": "x", "bid": "-1"}, "bid", ""),
            ]
            for body, param, words in cases:
                response = _post(client, body)
                assert response.status_code == 400, response.text
                error = response.json()["error"]
                assert error["param"] == param and words in error["message"]
            chat = client.post(
                "/v1/completions", json={"prompt": "x", "max_tokens": 2, "service_tier": "scale"}
            )
            assert chat.status_code == 400 and chat.json()["error"]["param"] == "service_tier"
        assert server.ledger.balance("bob").balance_micros == BUDGET
        assert server.ledger.entries("bob").entries == [] or all(
            e.kind == "grant" for e in server.ledger.entries("bob").entries
        )


def test_an_auction_server_refuses_a_tier_by_name(server: RunningServer) -> None:
    key = server.create_user("carol")
    with server.client(key) as client:
        response = _post(client, {"text": "x", "service_tier": "priority"})
        assert response.status_code == 400
        assert response.json()["error"]["param"] == "service_tier"
        ok = _post(client, {"text": "x", "service_tier": "auto", "bid": "0.01"})
        assert ok.status_code == 200 and "pricing" not in ok.json()["meta_info"]["auction"]
        assert client.get("/v1/market/tiers").status_code == 404


class _HeldEngine(EmbeddedEngine):
    """The embedded engine, holding back a request whose rid names it so (`hold`) until
    `release()`, called from any thread: sent, it has no first token until then."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self._held: list[Generation] = []
        self._loop: asyncio.AbstractEventLoop | None = None

    def _send(self, generations: list[Generation]) -> None:
        self._loop = asyncio.get_running_loop()
        held = [g for g in generations if "/hold" in g.request.rid]
        self._held.extend(held)
        super()._send([g for g in generations if g not in held])

    @property
    def held(self) -> int:
        return len(self._held)

    def release(self) -> None:
        assert self._loop is not None, "nothing was held"
        self._loop.call_soon_threadsafe(EmbeddedEngine._send, self, self._held)


async def _queue_length(client: httpx.AsyncClient) -> int:
    text = (await client.get("/metrics")).text
    line = next(x for x in text.splitlines() if x.startswith("inference_auction_queue_length "))
    return int(float(line.split()[1]))


@pytest.mark.anyio
@pytest.mark.parametrize("ahead", [True, False], ids=["sent-ahead", "sent-after-commit"])
async def test_a_higher_tier_is_served_first_under_saturation(
    ledger_db: MigratedDatabase, ahead: bool
) -> None:
    # The engine counts as saturated while one request sent to it has no first token: a
    # blocker held at the engine holds every request sent after it in the pool, and each
    # batch then takes the dearest tier's first, four at a time. The requests arrive one at a
    # time (each waits in the pool before the next is sent), and the blocker starts once all
    # of them wait, however slow the machine. Batches go to the engine ahead of their commit
    # or after it: the tiers' figures count both.
    settings = ServerSettings(
        database_url=ledger_db.url,
        **{
            **TEST_SETTINGS,
            **TIERS,
            "dispatch_ahead": ahead,
            "saturation_requests": 1,
            "batch_size": 4,
            "max_wait_ms": 0,
            # Room for a whole batch whether or not the blocker has left the engine by then.
            "max_inflight": 16,
        },
    )
    engine = _HeldEngine(time_scale=1.0)
    with serve_app(settings, engine=engine) as url:
        key = Ledger(ledger_db.new_engine()).create_user("dave", budget_micros=BUDGET).api_key
        headers = {"Authorization": f"Bearer {key}"}
        async with httpx.AsyncClient(base_url=url, headers=headers, timeout=60) as client:
            blocker = {
                "text": "blocker " * 6000,
                "rid": "hold",
                "sampling_params": {"max_new_tokens": 1},
            }
            tasks = [asyncio.create_task(client.post("/generate", json=blocker))]
            while not engine.held:
                await asyncio.sleep(0.005)
            for index, tier in enumerate(["flex"] * 4 + ["priority"] * 4):
                body = {
                    "text": f"Independent prompt {index} " * 30,
                    "service_tier": tier,
                    "rid": f"{tier}-{index:02d}",
                    "sampling_params": {"max_new_tokens": 8},
                }
                tasks.append(asyncio.create_task(client.post("/generate", json=body)))
                while await _queue_length(client) < index + 1:  # a known arrival order
                    await asyncio.sleep(0.005)
            engine.release()
            bodies = [(await task).json() for task in tasks[1:]]
            await tasks[0]
            menu = (await client.get("/v1/market/tiers")).json()
    first_token = {
        b["meta_info"]["id"]: b["meta_info"]["request_received_ts"]
        + b["meta_info"]["first_token_latency"]
        for b in bodies
    }
    priority = sorted(rid for rid in first_token if rid.startswith("priority"))
    flex = sorted(rid for rid in first_token if rid.startswith("flex"))
    # Sent last, the priority requests overtook every flex request waiting before them...
    assert max(first_token[rid] for rid in priority) < min(first_token[rid] for rid in flex)
    # ...and within a tier, first come, first served.
    for tier in (priority, flex):
        served = [next(b for b in bodies if b["meta_info"]["id"] == rid) for rid in tier]
        # The engine starts one at a time (`saturation_requests` 1): each clearing sends one.
        assert [b["meta_info"]["auction"]["position"] for b in served] == [0, 0, 0, 0]
        batch_ids = [b["meta_info"]["auction"]["batch_id"] for b in served]
        assert batch_ids == sorted(batch_ids)  # batch ids sort by time
        assert sorted(tier, key=first_token.__getitem__) == tier
    # What each tier published. Each went alone to the engine, so a place within its head says
    # 1 for every request; against the backlog it waited in, priority request k went ahead of
    # 7-k of its 7 competitors and flex request k of 3-k (the blocker, of no competitor, is
    # flex too: it counts 1).
    figures = {t["name"]: t for t in menu["tiers"]}
    sevenths = [k * 1_000_000 // 7 for k in range(8)]
    assert figures["priority"]["samples"] == 4 and figures["flex"]["samples"] == 5
    assert figures["priority"]["expected_priority_ppm"] == sum(sevenths[4:]) // 4
    assert figures["flex"]["expected_priority_ppm"] == (1_000_000 + sum(sevenths[:4])) // 5
    assert figures["priority"]["recent_wait_ms"] < figures["flex"]["recent_wait_ms"]


class _FailingEngine(EmbeddedEngine):
    """The embedded engine, failing every request whose rid names it so."""

    def _send(self, generations: list[Generation]) -> None:
        failing = [g for g in generations if "/fail" in g.request.rid]
        for generation in failing:
            generation.fail(EngineUnavailable("the engine lost this one"))
        super()._send([g for g in generations if g not in failing])


@pytest.mark.anyio
async def test_a_failed_tier_request_refunds_its_price_and_recovery_prices_the_same(
    ledger_db: MigratedDatabase,
) -> None:
    settings = ServerSettings(
        database_url=ledger_db.url, **{**TEST_SETTINGS, **TIERS, "max_wait_ms": 300}
    )
    with serve_app(settings, engine=_FailingEngine(time_scale=0.002)) as url:
        ledger = Ledger(ledger_db.new_engine())
        key = ledger.create_user("erin", budget_micros=BUDGET).api_key

        async def pair() -> list[httpx.Response]:
            async with httpx.AsyncClient(
                base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=60
            ) as client:
                bodies = [
                    {"text": "kept", "rid": "ok-1", "service_tier": "priority"},
                    {"text": "lost", "rid": "fail-1", "service_tier": "default"},
                ]
                posts = [
                    client.post("/generate", json={**b, "sampling_params": {"max_new_tokens": 4}})
                    for b in bodies
                ]
                return list(await asyncio.gather(*posts))

        ok, failed = await pair()
        assert ok.status_code == 200 and failed.status_code >= 500
        entries = ledger.entries("erin").entries
        charged = sum(-e.amount_micros for e in entries if e.kind == "charge")
        refunded = sum(e.amount_micros for e in entries if e.kind == "refund")
        assert ok.json()["meta_info"]["auction"]["batch_size"] == 2  # one batch, one charge
        assert (charged, refunded) == (PRICES["priority"] + PRICES["default"], PRICES["default"])
        assert ledger.balance("erin").balance_micros == BUDGET - PRICES["priority"]
        assert ledger.reconcile().ok
        # Crash recovery prices a tiers batch by the same rule: settle one by hand, serve
        # nothing of it, and let recovery refund what is still scheduled.
        now = datetime.now(UTC)
        for rid, price in (("erin/r1", 10_000), ("erin/r2", 1_000)):
            ledger.place_hold("erin", rid, price)
        batch = BatchInput(
            batch_id="tiers-lost",
            closed_at=now,
            n=2,
            revenue_micros=11_000,
            welfare_micros=0,
            pricing_rule="tiers",
        )
        requests = [
            RequestInput("erin/r1", "erin", 0, 1.0, 10_000, 3, arrival=0, tree_path=[1]),
            RequestInput("erin/r2", "erin", 1, 0.0, 1_000, 3, arrival=1, tree_path=[2]),
        ]
        ledger.settle_batch(batch, requests, {"erin": 11_000})
        refunds = ledger.refund_unserved(timedelta(0), rule=refund_rule)
        assert sum(r.amount_micros for r in refunds) == 11_000
        assert ledger.balance("erin").balance_micros == BUDGET - PRICES["priority"]
        assert ledger.reconcile().ok


@pytest.mark.anyio
async def test_fcfs_charges_nothing_and_keeps_arrival_order(ledger_db: MigratedDatabase) -> None:
    # One batch closes once the six wait; each is sent once the one before it waits in the pool,
    # so their arrival order is known however slow the machine.
    with running_server(ledger_db, pricing="fcfs", max_wait_ms=30_000, batch_size=6) as server:
        key = server.create_user("frank", budget=BUDGET)

        async def burst() -> list[dict[str, Any]]:
            async with server.async_client(key) as client:
                tasks = []
                for index in range(6):
                    body = {
                        "text": f"Prompt {index} " * 10,
                        "bid": f"0.0{index}",
                        "rid": f"r{index}",
                        "sampling_params": {"max_new_tokens": 4},
                    }
                    tasks.append(asyncio.create_task(client.post("/generate", json=body)))
                    while index < 5 and await _queue_length(client) < index + 1:
                        await asyncio.sleep(0.005)
                return [(await task).json() for task in tasks]

        bodies = await burst()
        with server.client(key) as client:
            tier = _post(client, {"text": "x", "service_tier": "priority"})
            rule = client.get("/v1/market/rule").json()
        assert tier.status_code == 400 and tier.json()["error"]["param"] == "service_tier"
        assert rule["pricing"] == "fcfs"
        for index, body in enumerate(bodies):
            auction = body["meta_info"]["auction"]
            assert auction["pricing"] == "fcfs" and auction["bid_micros"] == 0
            assert auction["request_charge_micros"] == 0 and auction["position"] == index
        assert _ledger_spend(server, "frank") == 0
        assert server.ledger.balance("frank").balance_micros == BUDGET
        assert server.ledger.reconcile().ok


@pytest.mark.anyio
async def test_replicas_of_different_pricing_on_one_ledger_refuse_to_run(
    ledger_db: MigratedDatabase,
) -> None:
    base = {**TEST_SETTINGS, "database_url": ledger_db.url}
    ledger = Ledger(ledger_db.new_engine())

    async def join(**settings: Any) -> None:
        agreement = RuleAgreement(ledger, ServerSettings(**base, **settings))
        await agreement.start()
        await agreement.stop()

    with serve_app(ServerSettings(**base, **TIERS, replica_name="a")):
        # The real command refuses to start, naming the replica it disagrees with.
        port = str(free_port())
        command = [sys.executable, "-m", "inference_auctions.server.cli", "serve"]
        command += ["--port", port, "--database-url", ledger_db.url, "--pricing", "auction"]
        refused = subprocess.run(command, check=False, capture_output=True, text=True, timeout=60)
        assert refused.returncode != 0
        assert "replica 'a' on this ledger clears under tiers (priority=10000" in refused.stderr
        with pytest.raises(RuleDisagreement, match="under fcfs"):
            await join(pricing="fcfs", replica_name="b")
        with pytest.raises(RuleDisagreement, match="priority=20000"):
            await join(**{**TIERS, "tiers": "flex=0,priority=0.02"}, replica_name="c")
        await join(**TIERS, replica_name="d")  # the same pricing runs beside it
    # Once it stopped, its row is gone: another mode may run.
    await join(pricing="fcfs", replica_name="e")


def test_the_settings_refuse_tiers_that_cannot_be_sold_and_a_fee_outside_the_auction() -> None:
    cases = {
        "flex=0,priority=0": "share a price",
        "flex=0,flex=1": "appears twice",
        "Flex=0": "is not name=price",
        "auto=1": "reserved",
        "flex=0,priority=0.0000001": "tiers: the price of 'priority'",
        "flex=0,priority=-1": "tiers: the price of 'priority'",
    }
    for tiers, words in cases.items():
        with pytest.raises(ValidationError, match=words):
            ServerSettings(pricing="tiers", tiers=tiers)
    with pytest.raises(ValidationError, match="default_tier: 'gold'"):
        ServerSettings(pricing="tiers", default_tier="gold")
    # Under fcfs there is no tier and no price: the refusal says so (it spoke of a tier's).
    with pytest.raises(ValidationError, match="request_fee_micros") as fcfs:
        ServerSettings(pricing="fcfs", request_fee_micros=5)
    assert "tier" not in str(fcfs.value) and "pays nothing" in str(fcfs.value)
    with pytest.raises(ValidationError, match="pays the price of its tier"):
        ServerSettings(pricing="tiers", tiers=TIERS["tiers"], request_fee_micros=5)
    menu = ServerSettings(pricing="tiers", tiers="a=0.5,b=0,c=0.000001").tier_menu()
    assert [(t.name, t.price_micros, t.engine_priority) for t in menu.tiers] == [
        ("a", 500_000, 0),
        ("c", 1, 100),
        ("b", 0, 200),
    ]
    assert menu.default.name == "b"


def test_a_menu_of_twenty_tiers_starts_on_every_database(ledger_db: MigratedDatabase) -> None:
    # Before: the tiers each replica sells were kept in a varchar(500), which PostgreSQL
    # enforces: a valid menu of 20 tiers (759 characters) could not start there.
    names = [f"priority-tier-{i:02d}-reserved-xyz" for i in range(20)]
    menu = ",".join(f"{name}={(i + 1) * 0.012345:.6f}" for i, name in enumerate(names))
    settings = ServerSettings(pricing="tiers", tiers=menu)
    signature = settings.tiers_signature()
    assert signature is not None and len(signature) > 700
    with running_server(ledger_db, pricing="tiers", tiers=menu) as server:
        key = server.create_user("alice", budget=BUDGET)
        with server.client(key) as client:
            response = _post(client, {"text": "Question?", "service_tier": names[-1]})
            assert response.status_code == 200, response.text
            assert response.json()["meta_info"]["auction"]["request_charge_micros"] == 246_900
