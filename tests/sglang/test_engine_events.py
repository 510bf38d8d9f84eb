"""What SGLang does that the emulator never did, and what the auction does about it.

* Killed under load: the requests it held fail and are refunded, `/health` names the engine as
  down, and service resumes once it is back (its limits read again).
* Health checks: SGLang's `/health` generates a token, queued at the lowest priority; the
  server probes `/v1/loads` instead, so its health checks put nothing in SGLang's queue and
  never stall behind the auctioned requests.
* Preemption: a request more urgent by at least 10 preempts a running one. The server's own
  priorities are its schedule sequence, so its requests never preempt an earlier one; a
  request preempted by someone else's traffic is retracted, recomputed and still served, and
  the auction charges it what it cleared at (`num_retractions` comes through to the client).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from bench.sglang_cpu.launcher import SGLangServer
from tests.db_fixtures import MigratedDatabase, migrated_database
from tests.server.harness import running_server
from tests.sglang.conftest import assert_ledger_settled


@pytest.fixture
def sqlite_db(tmp_path: Path) -> Iterator[MigratedDatabase]:
    with migrated_database("sqlite", tmp_path) as db:
        yield db


def _body(tag: str, bid: str, new_tokens: int) -> dict[str, Any]:
    return {
        "text": f"{tag}: a question about the auction and the quiet lake",
        "bid": bid,
        "sampling_params": {"max_new_tokens": new_tokens, "temperature": 0, "ignore_eos": True},
    }


def _load(url: str) -> dict[str, Any]:
    rank: dict[str, Any] = httpx.get(url + "/v1/loads", timeout=10).json()["loads"][0]
    return rank


def _wait(condition: Any, what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.02)


@pytest.mark.anyio
async def test_health_checks_generate_nothing_at_sglang(
    sqlite_db: MigratedDatabase, sglang_url: str
) -> None:
    with running_server(sqlite_db, engine_url=sglang_url) as server:
        key = server.create_user("ann", budget=10_000_000)

        async def run() -> list[float]:
            headers = {"Authorization": f"Bearer {key}"}
            async with httpx.AsyncClient(base_url=server.url, headers=headers, timeout=120) as c:
                busy = asyncio.create_task(c.post("/generate", json=_body("busy", "0.3", 200)))
                await asyncio.to_thread(
                    _wait, lambda: _load(sglang_url)["num_running_reqs"] == 1, "busy runs"
                )
                took = []
                for _ in range(3):
                    began = time.monotonic()
                    health = await c.get("/health")
                    took.append(time.monotonic() - began)
                    assert health.status_code == 200, health.text
                    # Nothing of the health check waits in SGLang's queue.
                    assert _load(sglang_url)["num_waiting_reqs"] == 0
                assert not busy.done()
                assert (await busy).status_code == 200
                return took

        took = await run()
        # SGLang's own /health takes a second or more (a generation, then a sleep).
        assert max(took) < 1.0, took
        assert_ledger_settled(server, ["ann"])


@pytest.mark.anyio
async def test_sglang_killed_under_load_fails_and_refunds_then_service_resumes(
    sqlite_db: MigratedDatabase, sglang: SGLangServer, sglang_url: str
) -> None:
    with running_server(sqlite_db, engine_url=sglang_url, max_wait_ms=0) as server:
        key = server.create_user("ann", budget=10_000_000)

        async def run() -> list[httpx.Response]:
            headers = {"Authorization": f"Bearer {key}"}
            async with httpx.AsyncClient(base_url=server.url, headers=headers, timeout=120) as c:
                replies = [
                    asyncio.create_task(c.post("/generate", json=_body(f"r{i}", "0.4", 300)))
                    for i in range(4)
                ]
                await asyncio.to_thread(
                    _wait, lambda: _load(sglang_url)["num_running_reqs"] == 1, "one runs"
                )
                await asyncio.to_thread(sglang.kill)
                return list(await asyncio.gather(*replies))

        replies = await run()
        failed = [r for r in replies if r.status_code != 200]
        assert failed, "the requests SGLang held fail"
        for reply in failed:
            assert reply.status_code in (502, 503), reply.text
            assert reply.json()["error"]["type"] in ("engine_error", "unavailable"), reply.text
        assert server.ledger.balance("ann").held_micros == 0
        # Refunded by the rule: only requests that were served are charged (their charge and
        # their part of the posted floor, which a pool deeper than the engine's room raises).
        assert server.ledger.balance("ann").balance_micros == 10_000_000 - sum(
            auction["request_charge_micros"] + auction.get("floor_micros", 0)
            for r in replies
            if r.status_code == 200
            for auction in [r.json()["meta_info"]["auction"]]
        )
        health = httpx.get(server.url + "/health", timeout=30)
        assert health.status_code == 503 and "engine" in health.text
        sglang.start()  # the same port: the server finds it again
        _wait(lambda: httpx.get(server.url + "/health", timeout=30).status_code == 200, "up")
        with server.client(key) as client:
            again = client.post("/generate", json=_body("again", "0.2", 3))
        assert again.status_code == 200, again.text
        assert_ledger_settled(server, ["ann"])


@pytest.mark.anyio
async def test_a_request_preempted_at_sglang_is_served_and_charged_as_cleared(
    sqlite_db: MigratedDatabase, sglang_url: str
) -> None:
    with running_server(sqlite_db, engine_url=sglang_url, max_wait_ms=0) as server:
        key = server.create_user("ann", budget=10_000_000)

        async def run() -> tuple[httpx.Response, httpx.Response]:
            headers = {"Authorization": f"Bearer {key}"}
            async with (
                httpx.AsyncClient(base_url=server.url, headers=headers, timeout=120) as c,
                httpx.AsyncClient(base_url=sglang_url, timeout=120) as direct,
            ):
                ours = asyncio.create_task(c.post("/generate", json=_body("ours", "0.6", 60)))
                await asyncio.to_thread(
                    _wait, lambda: _load(sglang_url)["num_running_reqs"] == 1, "ours runs"
                )
                # Someone else's request, more urgent by far than the server's sequence.
                other = await direct.post(
                    "/generate",
                    json={
                        "text": "an urgent request from another client",
                        "priority": -1_000_000,
                        "sampling_params": {"max_new_tokens": 2, "ignore_eos": True},
                    },
                )
                return await ours, other

        ours, other = await run()
        assert other.status_code == 200, other.text
        assert ours.status_code == 200, ours.text
        meta = ours.json()["meta_info"]
        assert meta["num_retractions"] >= 1, "SGLang preempted the running request"
        assert meta["completion_tokens"] == 60, "and still served it whole"
        charged = meta["auction"]["request_charge_micros"] + meta["auction"].get("floor_micros", 0)
        assert server.ledger.balance("ann").balance_micros == 10_000_000 - charged
        assert_ledger_settled(server, ["ann"])
