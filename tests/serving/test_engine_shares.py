"""What one request, one user or free traffic may hold of the engine at once.

`max_inflight` is a hard cap on the requests outstanding at the engine, whatever the batch
size; each test ends with an audit of the money against the answers.
"""

from __future__ import annotations

import asyncio
import threading
import time

import httpx
import pytest

from tests.db_fixtures import MigratedDatabase
from tests.server.harness import RunningServer, running_server
from tests.server.money_audit import audit_money_against_answers


def _inflight(server: RunningServer) -> float:
    text = httpx.get(f"{server.url}/metrics").text
    return next(
        float(line.split()[1])
        for line in text.splitlines()
        if line.startswith("inference_auction_engine_inflight ")
    )


class _Watch:
    """The most requests seen outstanding at the engine, polled in a thread."""

    def __init__(self, server: RunningServer) -> None:
        self.most = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, args=(server,), daemon=True)
        self._thread.start()

    def _poll(self, server: RunningServer) -> None:
        while not self._stop.is_set():
            self.most = max(self.most, _inflight(server))

    def stop(self) -> float:
        self._stop.set()
        self._thread.join(5)
        return self.most


@pytest.mark.anyio
async def test_max_inflight_is_a_hard_cap_whatever_the_batch_size(
    ledger_db: MigratedDatabase,
) -> None:
    # Before: a batch closed while fewer than 10 were out took up to 64, whatever room was left.
    with running_server(
        ledger_db, max_inflight=10, batch_size=64, emulator_time_scale=0.2, max_wait_ms=50
    ) as server:
        key = server.create_user("many", budget=10_000_000)
        watch = _Watch(server)

        async def burst() -> list[httpx.Response]:
            async with server.async_client(key) as client:
                body = {"bid": "0.01", "sampling_params": {"max_new_tokens": 40}}
                return list(
                    await asyncio.gather(
                        *(
                            client.post("/generate", json={**body, "rid": f"r{i}", "text": f"q{i}"})
                            for i in range(40)
                        )
                    )
                )

        responses = await burst()
        most = watch.stop()
        assert [r.status_code for r in responses] == [200] * 40
        assert 1 <= most <= 10, f"{most:g} requests were at the engine at once"
        audit_money_against_answers(server.ledger, {f"many/r{i}": "served" for i in range(40)})


async def _timed_post(
    client: httpx.AsyncClient, body: dict[str, object], done: dict[str, float]
) -> httpx.Response:
    response = await client.post("/generate", json=body)
    done[str(body["rid"])] = time.monotonic()
    return response


@pytest.mark.anyio
async def test_free_traffic_cannot_fill_the_engine_ahead_of_a_bidder(
    ledger_db: MigratedDatabase,
) -> None:
    # Before: four free requests of seconds each took all four slots, and a bidder who came a
    # moment later waited for one of them to end.
    with running_server(
        ledger_db, max_inflight=4, zero_bid_share=0.5, emulator_time_scale=0.5, batch_size=8
    ) as server:
        free = server.create_user("free", budget=0)
        payer = server.create_user("payer", budget=10_000_000)
        done: dict[str, float] = {}

        async def attack() -> list[httpx.Response]:
            async with server.async_client(free) as f, server.async_client(payer) as p:
                long = {"max_new_tokens": 150, "ignore_eos": True}
                flood = [
                    asyncio.create_task(
                        _timed_post(
                            f, {"rid": f"f{i}", "text": f"free {i}", "sampling_params": long}, done
                        )
                    )
                    for i in range(4)
                ]
                await asyncio.sleep(0.3)
                short = {"max_new_tokens": 4}
                bid = {"rid": "p", "text": "pay", "bid": "1", "sampling_params": short}
                paid = await _timed_post(p, bid, done)
                return [paid, *await asyncio.gather(*flood)]

        responses = await attack()
        assert [r.status_code for r in responses] == [200] * 5
        first_free = min(t for rid, t in done.items() if rid.startswith("f"))
        assert done["p"] < first_free, "the bidder waited for free requests to end"
        # Bigger than free traffic's share of the engine's tokens: refused by name.
        huge = httpx.post(
            f"{server.url}/generate",
            headers={"Authorization": f"Bearer {free}"},
            json={"text": "q", "sampling_params": {"max_new_tokens": 12_000}},
        )
        assert huge.status_code == 400 and "zero_bid_share" in huge.json()["error"]["message"]
        outcomes = {f"free/f{i}": "served" for i in range(4)} | {"payer/p": "served"}
        audit_money_against_answers(server.ledger, outcomes)


@pytest.mark.anyio
async def test_one_user_cannot_keep_the_engine_from_another(ledger_db: MigratedDatabase) -> None:
    # Before: the pool was first come, first served, so B waited behind all of A's backlog.
    with running_server(
        ledger_db, max_inflight=4, user_share=0.5, emulator_time_scale=0.5, batch_size=8
    ) as server:
        keys = {name: server.create_user(name, budget=10_000_000) for name in ("a", "b")}
        done: dict[str, float] = {}

        async def contest() -> list[httpx.Response]:
            async with server.async_client(keys["a"]) as a, server.async_client(keys["b"]) as b:
                long = {"max_new_tokens": 100, "ignore_eos": True}
                backlog = [
                    asyncio.create_task(
                        _timed_post(
                            a,
                            {
                                "rid": f"a{i}",
                                "text": f"a {i}",
                                "bid": "0.01",
                                "sampling_params": long,
                            },
                            done,
                        )
                    )
                    for i in range(8)
                ]
                await asyncio.sleep(0.3)
                short = {"max_new_tokens": 4}
                mine = [
                    _timed_post(
                        b,
                        {"rid": f"b{i}", "text": f"b {i}", "bid": "0.01", "sampling_params": short},
                        done,
                    )
                    for i in range(2)
                ]
                return list(await asyncio.gather(*mine, *backlog))

        responses = await contest()
        assert [r.status_code for r in responses] == [200] * 10
        last_a = sorted(t for rid, t in done.items() if rid.startswith("a"))
        assert max(done["b0"], done["b1"]) < last_a[-2], "b waited behind a's whole backlog"
        outcomes = {f"a/a{i}": "served" for i in range(8)} | {f"b/b{i}": "served" for i in range(2)}
        audit_money_against_answers(server.ledger, outcomes)
