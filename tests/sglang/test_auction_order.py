"""The auction's order on the real SGLang, one running request at a time.

SGLang runs one request at a time (`--max-running-requests 1`, which its `/server_info`
states and the server learns). A long request keeps it busy; meanwhile bidders of three users
arrive and wait in the server's pool, not in SGLang's queue; a late high bidder arrives last.
At every opening the server auctions everything waiting and sends SGLang the one request it can
start: the late high bidder first, then always the highest bid still waiting, a second wave's
included, and the heads pay. Both dispatch modes.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.db_fixtures import MigratedDatabase, migrated_database
from tests.server.harness import running_server
from tests.sglang.conftest import assert_ledger_settled, first_token_at

USERS = ("alice", "bob", "carol")
WAVE = 9  # bidders per wave, three per user
# Decode steps that keep SGLang's one slot busy while the others arrive: long enough for two
# waves and a late bidder to be admitted on a loaded machine (48 was not, once, in CI).
BUSY_TOKENS = 256


@pytest.fixture
def sqlite_db(tmp_path: Path) -> Iterator[MigratedDatabase]:
    with migrated_database("sqlite", tmp_path) as db:
        yield db


def _wait_for(
    condition: Callable[[], bool],
    what: str,
    timeout: float = 60,
    state: Callable[[], object] = lambda: "",
) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting until {what} {state()}")
        time.sleep(0.01)


def _gauge(server_url: str, name: str) -> float:
    text = httpx.get(server_url + "/metrics", timeout=10).text
    match = re.search(rf"^inference_auction_{name} (\S+)$", text, re.MULTILINE)
    assert match is not None, name
    return float(match[1])


def _engine_load(sglang_url: str) -> dict[str, Any]:
    rank: dict[str, Any] = httpx.get(sglang_url + "/v1/loads", timeout=10).json()["loads"][0]
    return rank


def _body(tag: str, bid: str, new_tokens: int = 3) -> dict[str, Any]:
    # Unrelated prompts: the auction orders them by bid alone.
    return {
        "text": f"{tag}: tell me about the {tag} of the lake and the boat",
        "bid": bid,
        "sampling_params": {"max_new_tokens": new_tokens, "ignore_eos": True, "temperature": 0},
    }


@pytest.mark.anyio
@pytest.mark.parametrize("mode", ["priority", "ordered"])
async def test_waiting_bidders_are_auctioned_and_served_in_auction_order(
    sqlite_db: MigratedDatabase, sglang_url: str, mode: str
) -> None:
    with running_server(
        sqlite_db,
        engine_url=sglang_url,
        engine_mode=mode,
        max_wait_ms=0,
        batch_size=64,
        max_inflight=64,  # a hard cap: the whole backlog fits one batch
    ) as server:
        # The server learnt SGLang's limit from its /server_info.
        info = httpx.get(server.url + "/server_info", timeout=10).json()
        assert info["engine_max_running_requests"] == 1
        keys = {user: server.create_user(user, budget=50_000_000) for user in USERS}

        async def send(client: httpx.AsyncClient, user: str, body: dict[str, Any]) -> Any:
            sent = time.time()
            reply = await client.post(
                "/generate", json=body, headers={"Authorization": f"Bearer {keys[user]}"}
            )
            assert reply.status_code == 200, reply.text
            answer = reply.json()
            answer["sent_at"] = sent  # this side's clock, the engine's host's
            return answer

        async def wave(client: httpx.AsyncClient, name: str, bids: list[str]) -> list[Any]:
            return [
                asyncio.create_task(send(client, USERS[i % 3], _body(f"{name}{i}", bid)))
                for i, bid in enumerate(bids)
            ]

        async def run() -> tuple[Any, list[Any], Any, list[Any]]:
            async with httpx.AsyncClient(base_url=server.url, timeout=300) as client:
                busy = asyncio.create_task(
                    send(client, "alice", _body("busy", "0.5", new_tokens=BUSY_TOKENS))
                )
                await asyncio.to_thread(
                    _wait_for,
                    lambda: busy.done() or _engine_load(sglang_url)["num_running_reqs"] == 1,
                    "the busy request runs",
                    state=lambda: (
                        _engine_load(sglang_url),
                        httpx.get(server.url + "/server_info", timeout=10).json(),
                    ),
                )
                # A busy request that failed or ended first says why here, not after a timeout.
                assert not busy.done(), f"the busy request ended before it was seen: {busy}"
                first = await wave(client, "w", [f"0.{10 + 7 * i}" for i in range(WAVE)])
                await asyncio.to_thread(
                    _wait_for,
                    lambda: _gauge(server.url, "queue_length") == WAVE,
                    "the first wave waits in the pool",
                    state=lambda: (
                        _gauge(server.url, "queue_length"),
                        _gauge(server.url, "engine_inflight"),
                        _engine_load(sglang_url),
                        busy.done(),
                    ),
                )
                # They wait here, not in SGLang's queue, where no auction could reorder them.
                assert _engine_load(sglang_url)["num_waiting_reqs"] == 0
                assert not busy.done()
                late = asyncio.create_task(send(client, "bob", _body("late", "0.99")))
                await asyncio.to_thread(
                    _wait_for,
                    lambda: _gauge(server.url, "queue_length") == WAVE + 1,
                    "the late bidder waits too",
                )
                first_done = await asyncio.gather(*first[:1])  # the first batch has started
                second = await wave(client, "v", [f"0.{20 + 5 * i}" for i in range(WAVE)])
                return (
                    await busy,
                    first_done + list(await asyncio.gather(*first[1:])),
                    await late,
                    list(await asyncio.gather(*second)),
                )

        busy, first, late, second = await run()
        everyone = [late, *first, *second]
        assert busy["meta_info"]["auction"]["batch_id"] not in {
            b["meta_info"]["auction"]["batch_id"] for b in everyone
        }
        # One at a time, at every opening, the highest bid still waiting: the late high bidder
        # first, whatever it arrived after.
        starts = {id(b): first_token_at(b["meta_info"]) for b in everyone}
        assert starts[id(late)] < min(starts[id(b)] for b in [*first, *second])
        # A request sent to the engine went before every lower bid already waiting then (sent
        # here before it reached the engine), the second wave's included: no place is fixed
        # until a request is sent.
        for a in everyone:
            dispatched = a["meta_info"]["request_received_ts"]
            bid = a["meta_info"]["auction"]["bid_micros"]
            for b in everyone:
                if starts[id(b)] > starts[id(a)] and b["sent_at"] < dispatched - 0.05:
                    assert bid >= b["meta_info"]["auction"]["bid_micros"], (a, b)
        # Each clearing sends one (SGLang runs one): every head a batch of its own.
        assert all(b["meta_info"]["auction"]["position"] == 0 for b in everyone)
        # Bidders for one engine: the heads pay for the delay they impose on the pool.
        assert sum(b["meta_info"]["auction"]["request_charge_micros"] for b in everyone) > 0
        assert_ledger_settled(server, list(USERS))
