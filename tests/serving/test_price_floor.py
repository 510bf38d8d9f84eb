"""`--price-floor posted` on a real server and port (docs/SPEC.md section 7, "The price floor"):
bids below the floor wait outside the auction and go, in arrival order, once no entrant waits,
paying nothing; an entrant pays the floor in force at its clearing, as a `floor` entry beside
its charge, never more than its bid; the floor climbs while the pool is deeper than its target
and falls while shallower, each step the study's `next_floor`; the floor is published, logged
with every clearing and exported as a gauge; a failed entrant gets its floor back; a retried
request is not charged again. The engine holds one request for as long as the test wants, so
that the pool fills behind it."""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from click.testing import CliRunner
from pydantic import ValidationError

from inference_auctions.billing import Ledger
from inference_auctions.server.auction.price_floor import next_floor
from inference_auctions.server.cli import main
from inference_auctions.server.emulator.embedded import EmbeddedEngine
from inference_auctions.server.engine.errors import EngineUnavailable
from inference_auctions.server.engine.protocol import Generation
from inference_auctions.server.settings import ServerSettings
from tests.db_fixtures import MigratedDatabase
from tests.server.harness import TEST_SETTINGS, RunningServer, serve_app

START = 10_000
BUDGET = 10_000_000


class _HoldingEngine(EmbeddedEngine):
    """The embedded engine, writing down the order it receives requests in (client rids),
    holding back the one whose rid is `hold` until `release()`, and failing any whose rid
    starts with `fail`."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.sent: list[str] = []
        self._held: list[Generation] = []
        self._loop: asyncio.AbstractEventLoop | None = None

    def _send(self, generations: list[Generation]) -> None:
        self._loop = asyncio.get_running_loop()
        going = []
        for generation in generations:
            rid = generation.request.rid.rsplit("/", 1)[-1]
            self.sent.append(rid)
            if rid == "hold":
                self._held.append(generation)
            elif rid.startswith("fail"):
                generation.fail(EngineUnavailable("the test engine fails this one"))
            else:
                going.append(generation)
        super()._send(going)

    @property
    def held(self) -> int:
        return len(self._held)

    def release(self) -> None:
        assert self._loop is not None, "nothing was held"
        self._loop.call_soon_threadsafe(EmbeddedEngine._send, self, self._held)


@contextmanager
def _floor_server(
    ledger_db: MigratedDatabase, log: Path, target: int
) -> Iterator[tuple[RunningServer, _HoldingEngine]]:
    """A server under a posted floor of `START` aiming at `target` entrants, whose engine
    starts one request at a time, logging every clearing to `log`."""
    settings = ServerSettings(
        database_url=ledger_db.url,
        **{
            **TEST_SETTINGS,
            "price_floor": "posted",
            "price_floor_start": START,
            "price_floor_target": target,
            "saturation_requests": 1,
            "clearing_log": log,
        },
    )
    engine = _HoldingEngine(time_scale=0.002)
    with serve_app(settings, engine=engine) as url:
        yield (
            RunningServer(url=url, settings=settings, ledger=Ledger(ledger_db.new_engine())),
            engine,
        )


def _body(rid: str, bid: int) -> dict[str, Any]:
    return {
        "text": f"Question {rid}?",
        "rid": rid,
        "bid": f"{bid / 1_000_000:.6f}",
        "sampling_params": {"max_new_tokens": 2},
    }


async def _queued(client: httpx.AsyncClient) -> int:
    text = (await client.get("/metrics")).text
    line = next(x for x in text.splitlines() if x.startswith("inference_auction_queue_length "))
    return int(float(line.split()[1]))


def _gauge(client: httpx.Client) -> float:
    text = client.get("/metrics").text
    line = next(
        x for x in text.splitlines() if x.startswith("inference_auction_price_floor_micros ")
    )
    return float(line.split()[1])


def _clearings(log: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in log.read_text().splitlines()]


def _check_the_floors_path(clearings: list[dict[str, Any]], target: int) -> None:
    """Every clearing under a floor is logged, so the log holds each of the floor's steps: each
    line's level is `next_floor` of the line before's level and pool depth (its entrants)."""
    for before, after in itertools.pairwise(clearings):
        level = before["price_floor_micros"]
        assert after["price_floor_micros"] == next_floor(level, len(before["pool"]), target)
        assert abs(after["price_floor_micros"] - level) <= max(1, level // 8)


def _entries(server: RunningServer, name: str, kind: str) -> list[int]:
    return [e.amount_micros for e in server.ledger.entries(name, kind=kind, limit=1000).entries]


async def _held_then_pool(
    server: RunningServer,
    engine: _HoldingEngine,
    key: str,
    queued: list[tuple[str, str, int]],
    meanwhile: Callable[[], None] = lambda: None,
) -> list[httpx.Response]:
    """A request held at the engine; `queued` (user key, rid, bid) sent one after another
    behind it; `meanwhile()` while they wait; then the held one released. The responses: the
    held one's first, then `queued`'s."""
    clients = [server.async_client(key), *(server.async_client(user) for user, _, _ in queued)]
    try:
        tasks = [asyncio.create_task(clients[0].post("/generate", json=_body("hold", 50_000)))]
        while not engine.held:
            await asyncio.sleep(0.005)
        for index, (_, rid, bid) in enumerate(queued):
            body = _body(rid, bid)
            tasks.append(asyncio.create_task(clients[index + 1].post("/generate", json=body)))
            while await _queued(clients[0]) < index + 1:  # in this arrival order
                await asyncio.sleep(0.005)
        await asyncio.to_thread(meanwhile)
        engine.release()
        return list(await asyncio.gather(*tasks))
    finally:
        for client in clients:
            await client.aclose()


@pytest.mark.anyio
async def test_below_the_floor_waits_outside_and_entrants_pay_the_floor(
    ledger_db: MigratedDatabase, tmp_path: Path
) -> None:
    log = tmp_path / "clearings.jsonl"
    with _floor_server(ledger_db, log, target=1) as (server, engine):
        alice = server.create_user("alice", budget=BUDGET)
        bob = server.create_user("bob", budget=BUDGET)
        queued = [(bob, "low-1", 5_000), (alice, "e-1", 20_000), (bob, "low-2", 6_000)]
        queued.append((alice, "e-2", 30_000))

        def meanwhile() -> None:
            with server.client(bob) as client:
                # One clearing so far (the held one's: one entrant, the target): it stays.
                rule = client.get("/v1/market/rule").json()["price_floor"]
                assert rule == {"mode": "posted", "micros": START, "target": 1}
                pool = client.get("/v1/market/pool", params={"bid": 25_000}).json()
                assert set(pool) == {
                    "price_floor_micros",
                    "entrants",
                    "outside",
                    "ahead",
                    "starts_per_second",
                }
                assert (pool["price_floor_micros"], pool["entrants"], pool["outside"]) == (
                    START,
                    2,
                    2,
                )
                assert pool["ahead"] == 1  # e-2 bids more; e-1 is overtaken
                assert client.get("/v1/market/pool", params={"bid": 5_000}).json()["ahead"] == 2
                assert client.get("/v1/market/pool").json()["ahead"] == 2
                for bad in ("abc", "-5", "1.5"):
                    refused = client.get("/v1/market/pool", params={"bid": bad})
                    assert refused.status_code == 400, refused.text
                    assert refused.json()["error"]["param"] == "bid"
                anonymous = client.get("/v1/market/pool", headers={"Authorization": ""})
                assert anonymous.status_code == 401

        responses = await _held_then_pool(server, engine, alice, queued, meanwhile)
        assert [r.status_code for r in responses] == [200] * 5, [r.text for r in responses]
        # Entrants by bid, then the outside ones in arrival order, once no entrant waited.
        assert engine.sent == ["hold", "e-2", "e-1", "low-1", "low-2"]
        auction = {
            rid: r.json()["meta_info"]["auction"]
            for rid, r in zip(["hold", *(rid for _, rid, _ in queued)], responses, strict=True)
        }
        # The held one's clearing and e-2's priced at the start; e-2's had two entrants, one
        # above the target: up an eighth before e-1's.
        raised = next_floor(START, 2, 1)
        assert raised == START + START // 8
        floors = {rid: a["floor_micros"] for rid, a in auction.items()}
        assert floors == {"hold": START, "e-2": START, "e-1": raised, "low-1": 0, "low-2": 0}
        for rid, bid in (("hold", 50_000), ("e-2", 30_000), ("e-1", 20_000)):
            paid = auction[rid]["request_charge_micros"] + auction[rid]["floor_micros"]
            assert paid <= bid
        # e-2 passed e-1: 1/(K-1) of e-1's bid, besides the floor.
        assert auction["e-2"]["request_charge_micros"] == 20_000 // 7
        assert (
            auction["low-1"]["request_charge_micros"]
            == auction["low-2"]["request_charge_micros"]
            == 0
        )
        # The ledger: alice's floors as entries of their own, bob's low bids paid nothing.
        assert sorted(_entries(server, "alice", "floor")) == sorted([-START, -START, -raised])
        assert _entries(server, "bob", "floor") == _entries(server, "bob", "charge") == []
        assert server.ledger.balance("bob").balance_micros == BUDGET
        alice_paid = sum(a["request_charge_micros"] + a["floor_micros"] for a in auction.values())
        assert server.ledger.balance("alice").balance_micros == BUDGET - alice_paid
        # Every clearing is logged with the floor it priced with and each entrant's part, also
        # the two that sent only requests from outside: no head, nothing charged, but the floor
        # stepped down at each (no entrant waited), so each line's level is the step from the
        # line before it.
        clearings = _clearings(log)
        assert [c["head"] for c in clearings] == [
            ["alice/hold"],
            ["alice/e-2"],
            ["alice/e-1"],
            [],
            [],
        ]
        lowered = next_floor(raised, 0, 1)
        assert lowered < raised
        assert [c["price_floor_micros"] for c in clearings] == [
            START,
            START,
            raised,
            raised,
            lowered,
        ]
        assert [c["floors"] for c in clearings][1] == {"alice/e-2": START}
        assert [(c["charges"], c["floors"], c["pool"]) for c in clearings[3:]] == [({}, {}, [])] * 2
        _check_the_floors_path(clearings, target=1)

        # A retry of a served request replays its answer: no second floor, no second charge.
        async with server.async_client(alice) as retrying:
            again = await retrying.post("/generate", json=_body("e-2", 30_000))
        assert again.json()["meta_info"]["auction"] == auction["e-2"]
        assert len(_entries(server, "alice", "floor")) == 3

        # An entrant the engine fails gets its floor back, once, in the same ledger.
        with server.client(alice) as client:
            level = client.get("/v1/market/rule").json()["price_floor"]["micros"]
            # The log's last line and its step explain the floor now.
            assert level == next_floor(lowered, 0, 1)
            failed = client.post("/generate", json=_body("fail-1", 40_000))
            assert failed.status_code >= 500, failed.text
            assert _gauge(client) == client.get("/v1/market/rule").json()["price_floor"]["micros"]
        floor_entries = _entries(server, "alice", "floor")
        assert -level in floor_entries and level in floor_entries
        assert server.ledger.balance("alice").balance_micros == BUDGET - alice_paid
        assert server.ledger.balance("alice").held_micros == 0
        assert server.ledger.reconcile().ok
        # The operator's dashboard shows the floor where it shows the market's rule.
        root = server.create_user("root", budget=0, admin=True)
        with httpx.Client(base_url=server.url, timeout=60) as client:
            signed = client.post(
                "/v1/dashboard/session", headers={"Authorization": f"Bearer {root}"}
            )
            assert signed.status_code == 200, signed.text
            market = client.get("/v1/dashboard/market").json()
            now = client.get("/v1/market/rule", headers={"Authorization": f"Bearer {root}"})
        pricing = market["pricing"]
        assert pricing["price_floor_micros"] == now.json()["price_floor"]["micros"]
        assert pricing["price_floor_target"] == 1
        # Its totals count the floors taken, the failed request's included (given back later).
        taken = [-a for name in ("alice", "bob") for a in _entries(server, name, "floor") if a < 0]
        assert market["totals"]["floors_micros"] == sum(taken) > 0
        series = market["series"]["floors_micros_per_minute"]
        assert sum(series) * market["bucket_seconds"] // 60 == sum(taken)


@pytest.mark.anyio
async def test_the_floor_climbs_under_a_deep_pool_and_falls_when_shallow(
    ledger_db: MigratedDatabase, tmp_path: Path
) -> None:
    log = tmp_path / "clearings.jsonl"
    target = 2
    with _floor_server(ledger_db, log, target=target) as (server, engine):
        keys = [server.create_user(f"u{index}", budget=BUDGET) for index in range(4)]
        deep = [(keys[i % 4], f"d-{i}", 40_000 + 1_000 * i) for i in range(8)]
        responses = await _held_then_pool(server, engine, keys[0], deep)
        assert all(r.status_code == 200 for r in responses)
        for response, bid in zip(responses, [50_000, *(b for _, _, b in deep)], strict=True):
            auction = response.json()["meta_info"]["auction"]
            # Each entrant charged once, floor and share of its charge within its bid (one
            # that waited K-1 = 7 sends or more is worth nothing by its bid, and pays nothing).
            assert auction["floor_micros"] >= 0
            assert auction["request_charge_micros"] + auction["floor_micros"] <= bid
        paid_floors = sum(r.json()["meta_info"]["auction"]["floor_micros"] for r in responses)
        assert -sum(sum(_entries(server, f"u{i}", "floor")) for i in range(4)) == paid_floors
        deep_clearings = _clearings(log)
        with server.client(keys[1]) as client:
            peak = client.get("/v1/market/rule").json()["price_floor"]["micros"]
            for index in range(5):  # one at a time: a pool of one, below the target
                served = client.post("/generate", json=_body(f"s-{index}", 60_000))
                assert served.status_code == 200, served.text
            low = client.get("/v1/market/rule").json()["price_floor"]["micros"]
        clearings = _clearings(log)
        levels = [c["price_floor_micros"] for c in clearings] + [low]
        depths = [len(c["pool"]) for c in clearings]
        # Each step is the study's, up to the floor in force now.
        _check_the_floors_path(clearings, target)
        assert low == next_floor(levels[-2], depths[-1], target)
        assert depths[: len(deep_clearings)] == [1, 8, 7, 6, 5, 4, 3, 2, 1]
        assert peak > START  # climbed while the pool held more than the target...
        assert levels[len(deep_clearings) :] == sorted(levels[len(deep_clearings) :], reverse=True)
        assert low < peak  # ...and fell while it held fewer
        assert server.ledger.reconcile().ok
        for index in range(4):
            # Nobody paid more than its bids: charges and floors within what was bid.
            spent = sum(
                -e.amount_micros
                for e in server.ledger.entries(f"u{index}", limit=1000).entries
                if e.kind in ("charge", "floor", "refund")
            )
            bids = sum(bid for key, _, bid in deep if key == keys[index])
            bids += 50_000 if index == 0 else 0
            bids += 5 * 60_000 if index == 1 else 0
            assert 0 < spent <= bids


def test_by_default_the_floor_rests_at_zero_and_a_lone_request_pays_nothing(
    server: RunningServer,
) -> None:
    key = server.create_user("ada")
    with server.client(key) as client:
        rule = client.get("/v1/market/rule").json()
        assert rule["price_floor"] == {"mode": "posted", "micros": 0, "target": 8}
        pool = client.get("/v1/market/pool", params={"bid": 10}).json()
        assert (pool["price_floor_micros"], pool["entrants"], pool["outside"]) == (0, 0, 0)
        served = client.post("/generate", json={"text": "hi", "bid": "0.01"})
        auction = served.json()["meta_info"]["auction"]
        assert (auction["floor_micros"], auction["request_charge_micros"]) == (0, 0)
        assert _gauge(client) == 0
    assert _entries(server, "ada", "floor") == [] and _entries(server, "ada", "charge") == []


def test_off_publishes_no_floor(ledger_db: MigratedDatabase) -> None:
    settings = ServerSettings(database_url=ledger_db.url, **{**TEST_SETTINGS, "price_floor": "off"})
    with serve_app(settings) as url:
        server = RunningServer(url=url, settings=settings, ledger=Ledger(ledger_db.new_engine()))
        key = server.create_user("ada")
        with server.client(key) as client:
            rule = client.get("/v1/market/rule").json()
            assert rule["price_floor"] == {"mode": "off", "micros": None, "target": None}
            pool = client.get("/v1/market/pool", params={"bid": 10}).json()
            assert (pool["price_floor_micros"], pool["entrants"], pool["outside"]) == (None, 0, 0)
            assert pool["ahead"] == 0
            served = client.post("/generate", json={"text": "hi", "bid": "0.01"})
            assert "floor_micros" not in served.json()["meta_info"]["auction"]
            assert _gauge(client) == 0
            assert client.get("/v1/market/pool").json()["starts_per_second"] > 0


@pytest.mark.parametrize(
    "options",
    [
        ["--pricing", "tiers"],
        ["--pricing", "fcfs"],
        ["--scheduling", "batches"],
    ],
)
def test_a_posted_floor_outside_the_rolling_auction_is_refused_in_one_line(
    options: list[str],
) -> None:
    result = CliRunner().invoke(main, ["serve", "--price-floor", "posted", *options])
    assert result.exit_code == 2
    lines = [line for line in result.output.splitlines() if "--price-floor" in line]
    assert len(lines) == 1 and "needs --pricing auction and --scheduling rolling" in lines[0]
    with pytest.raises(ValidationError, match="--price-floor posted needs"):
        ServerSettings(price_floor="posted", pricing="tiers")
    assert ServerSettings(price_floor="off", pricing="tiers").price_floor == "off"
    # The default floor needs no flag, and stays out of the modes without an auction pool.
    assert ServerSettings(pricing="tiers").posts_price_floor is False
    assert ServerSettings(scheduling="batches").posts_price_floor is False
    assert ServerSettings().posts_price_floor is True
