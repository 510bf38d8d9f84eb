"""Failures on the path of a request: the engine fails or is slow, the client leaves early,
the server shuts down. Every case ends with the ledger reconciling and no money lost."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from tests.billing.helpers import get_hold
from tests.db_fixtures import MigratedDatabase
from tests.server.harness import running_server


def _wait_until(condition: object, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.02)


@pytest.mark.anyio
async def test_a_long_generation_is_not_a_stall_and_the_total_cap_serves_it_partly(
    ledger_db: MigratedDatabase,
) -> None:
    # Real time and a long generation (400 tokens: seconds) that streams a token every few
    # tens of milliseconds: the stall deadline (1 s without a token) never cuts it. The
    # operator's total cap (1.5 s) does, and the request is served with its output so far,
    # finish_reason `abort`, and charged: the engine did its work. (Stalls: tests/faults.)
    # A stall deadline this short needs a chunk per token from the engine: at the default
    # `engine_stream_interval` the deadline sees one chunk per 64 tokens (docs/ENGINE.md).
    with running_server(
        ledger_db,
        emulator_time_scale=1.0,
        engine_stall_timeout_seconds=1.0,
        engine_max_seconds=1.5,
        engine_stream_interval=1,
        batch_size=2,
        max_wait_ms=10_000,
    ) as server:
        rich = server.create_user("rich", budget=10_000_000)
        poor = server.create_user("poor", budget=10_000_000)

        async def contest() -> list[httpx.Response]:
            async with server.async_client(rich) as a, server.async_client(poor) as b:
                body = {
                    "text": "Write a very long essay",
                    "sampling_params": {"max_new_tokens": 400},
                }
                return list(
                    await asyncio.gather(
                        a.post("/generate", json={**body, "bid": "2"}),
                        b.post("/generate", json={**body, "text": "Another essay", "bid": "1"}),
                    )
                )

        responses = await contest()
        assert [r.status_code for r in responses] == [200, 200], responses[0].text
        for response in responses:
            meta = response.json()["meta_info"]
            assert meta["finish_reason"]["type"] == "abort"
            assert 0 < meta["completion_tokens"] < 400
        charged = 0
        for user in ("rich", "poor"):
            entries = server.ledger.entries(user).entries
            charged += sum(-e.amount_micros for e in entries if e.kind == "charge")
            assert not [e for e in entries if e.kind == "refund"]
        assert charged > 0  # the higher bid paid the other's externality, and keeps paying it
        rid = responses[0].json()["meta_info"]["id"]
        request = server.ledger.find_request(f"rich/{rid}")
        assert request is not None and str(request.status) == "served"
        assert server.ledger.reconcile().ok


@pytest.mark.anyio
async def test_a_client_that_leaves_before_its_batch_closes_gets_its_hold_back(
    ledger_db: MigratedDatabase,
) -> None:
    # One request at a time at the engine: the second one waits in the pool.
    with running_server(ledger_db, emulator_time_scale=1.0, max_inflight=1, batch_size=1) as server:
        key = server.create_user("zoe", budget=10_000_000)

        async def scenario() -> None:
            async with server.async_client(key) as client:
                busy = asyncio.create_task(
                    client.post(
                        "/generate",
                        json={
                            "text": "occupy the engine",
                            "bid": "0.1",
                            "sampling_params": {"max_new_tokens": 120},
                        },
                    )
                )
                await asyncio.sleep(0.3)
                with pytest.raises(httpx.ReadTimeout):
                    await client.post(
                        "/generate",
                        json={"text": "impatient", "bid": "0.7", "rid": "leaver"},
                        timeout=0.3,
                    )
                assert (await busy).status_code == 200

        await scenario()
        _wait_until(lambda: get_hold(server.ledger, "zoe/leaver") is not None)
        _wait_until(lambda: str(get_hold(server.ledger, "zoe/leaver").state) != "open")  # type: ignore[union-attr]
        assert server.ledger.find_request("zoe/leaver") is None  # never settled, never charged
        assert server.ledger.balance("zoe").held_micros == 0
        assert server.ledger.reconcile().ok


def test_shutdown_drains_waiting_requests(ledger_db: MigratedDatabase) -> None:
    with running_server(ledger_db, max_wait_ms=5_000, batch_size=1000) as server:
        key = server.create_user("yan", budget=10_000_000)
        results: list[httpx.Response] = []

        async def send() -> None:
            async with server.async_client(key) as client:
                results.extend(
                    await asyncio.gather(
                        *(
                            client.post("/generate", json={"text": f"q{i}", "bid": "0.01"})
                            for i in range(3)
                        )
                    )
                )

        import threading

        # The requests run on an event loop of their own in a thread (asyncio.run there):
        # this thread blocks in the server's shutdown while they wait in the pool.
        sender = threading.Thread(target=lambda: asyncio.run(send()))
        sender.start()
        _wait_until(lambda: server.ledger.balance("yan").held_micros == 30_000)
    # Leaving the block stopped the server; the batch that was still waiting was served.
    sender.join(30)
    assert [r.status_code for r in results] == [200, 200, 200]
    assert server.ledger.balance("yan").held_micros == 0
