"""The rolling auction end to end: the engine's queue never holds more than one step of this
server's requests, and every request is charged once, within its bid and fee, across clearings.

The server runs on a real port in front of `emulate-sglang` in its own process, which starts
at most `RUNNING` requests at a time; a burst of bidders makes a backlog several steps deep,
and the engine's own `/v1/loads` is read every few milliseconds while it drains.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from inference_auctions.server.auction import AuctionRequest
from inference_auctions.server.auction.reference import reference_rolling_charges
from inference_auctions.server.auction.rolling import order_pool, rolling_charges
from tests.db_fixtures import MigratedDatabase
from tests.processes import emulated_sglang
from tests.server.harness import running_server

RUNNING = 4
REQUESTS = 48
FEE = 7


@pytest.fixture(scope="module")
def sglang_url() -> Iterator[str]:
    """An `emulate-sglang` process that runs at most `RUNNING` requests at once."""
    with emulated_sglang(time_scale=0.05, max_running_requests=RUNNING) as url:
        yield url


async def _watch_waiting(sglang_url: str, stop: asyncio.Event) -> int:
    """The most requests ever waiting in the engine's own queue until `stop`."""
    most = 0
    async with httpx.AsyncClient(base_url=sglang_url, timeout=10) as client:
        while not stop.is_set():
            loads = (await client.get("/v1/loads")).json()
            ranks = loads.get("loads", [loads])
            most = max(most, sum(rank["num_waiting_reqs"] for rank in ranks))
            await asyncio.sleep(0.003)
    return most


async def _burst(url: str, keys: list[str]) -> list[dict[str, Any]]:
    """`REQUESTS` requests at once, bids from 0 (free) up, three users, fresh prompts."""

    async def one(client: httpx.AsyncClient, index: int) -> dict[str, Any]:
        body = {
            "text": f"request {index} about a subject of its own " * 40,
            "bid": f"0.000{index % 6}",  # 0 (free) to 500 micro-credits
            "rid": f"r{index}",
            "sampling_params": {"max_new_tokens": 12},
        }
        response = await client.post("/generate", json=body)
        assert response.status_code == 200, response.text
        answer: dict[str, Any] = response.json()
        return answer

    clients = [
        httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {k}"}, timeout=120)
        for k in keys
    ]
    try:
        return await asyncio.gather(
            *(one(clients[index % len(clients)], index) for index in range(REQUESTS))
        )
    finally:
        for client in clients:
            await client.aclose()


@pytest.mark.anyio
@pytest.mark.parametrize("scheduling", ["rolling", "batches"])
async def test_the_engine_never_queues_more_than_one_step_of_a_rolling_pool(
    ledger_db: MigratedDatabase, sglang_url: str, scheduling: str, tmp_path: Path
) -> None:
    log = tmp_path / "clearings.jsonl"
    settings = {
        "clearing_log": log,
        "scheduling": scheduling,
        "batch_size": 64,
        "max_inflight": 256,
        "max_wait_ms": 0,
        "deferral": False,
        "request_fee_micros": FEE,
        # The rolling charges alone, so that the clearing log prices them again exactly: the
        # posted floor caps a charge at what is left of a bid's worth at its delay, which the
        # log does not hold (tests/serving/test_price_floor.py checks the floor's lines).
        "price_floor": "off",
    }
    with running_server(ledger_db, engine_url=sglang_url, **settings) as server:
        keys = [server.create_user(name, budget=50_000_000) for name in ("ann", "ben", "cy")]
        stop = asyncio.Event()
        watcher = asyncio.create_task(_watch_waiting(sglang_url, stop))
        answers = await _burst(server.url, keys)
        stop.set()
        most_waiting = await watcher
        reconciled = server.ledger.reconcile()
        spent = {name: server.ledger.balance(name) for name in ("ann", "ben", "cy")}
    auctions = [answer["meta_info"]["auction"] for answer in answers]
    if scheduling == "batches":
        # Sent whole, the backlog queues inside the engine, where no later bid reorders it.
        assert most_waiting > RUNNING
        return
    assert most_waiting <= RUNNING, most_waiting
    assert len({a["batch_id"] for a in auctions}) > REQUESTS // RUNNING // 2  # many clearings
    # Each request charged once, within its bid and the fee; the ledger agrees.
    assert reconciled.ok
    for auction in auctions:
        assert auction["request_charge_micros"] <= auction["bid_micros"]
        assert auction["request_fee_micros"] == FEE
    paid: dict[str, int] = {}
    for key_index, answer in enumerate(answers):
        auction = answer["meta_info"]["auction"]
        user = ("ann", "ben", "cy")[key_index % 3]
        paid[user] = paid.get(user, 0) + auction["request_charge_micros"] + FEE
    for user, balance in spent.items():
        assert balance.spent_this_period_micros == paid[user], (user, balance, paid[user])
        assert balance.held_micros == 0
    _check_the_clearing_log(log, answers)


def _check_the_clearing_log(log: Path, answers: list[dict[str, Any]]) -> None:
    """Every clearing's charges, priced again from what its log line recorded: the pool's
    tree built anew, and by brute force where the pool is small; and as the answers say."""
    charged = {
        answer["meta_info"]["id"]: answer["meta_info"]["auction"]["user_batch_charge_micros"]
        for answer in answers
    }
    clearings = [orjson.loads(line) for line in log.read_bytes().splitlines()]
    assert clearings
    small = 0
    for clearing in clearings:
        pool = [AuctionRequest(r["rid"], r["user"], r["path"], r["bid"]) for r in clearing["pool"]]
        head = [index for index, r in enumerate(pool) if r.rid in set(clearing["head"])]
        ordered = order_pool(pool)
        assert [pool[i].rid for i in ordered.order[: len(head)]] == clearing["head"]
        assert rolling_charges(ordered, head, clearing["slots"]) == clearing["charges"]
        if len(pool) <= 6:
            small += 1
            assert (
                reference_rolling_charges(pool, set(clearing["head"]), clearing["slots"])
                == clearing["charges"]
            )
        for rid in clearing["head"]:
            user = next(r.user for r in pool if r.rid == rid)
            assert charged[rid.split("/", 1)[1]] == clearing["charges"][user]
    assert small, "no clearing small enough for the brute-force oracle"
