"""What one request, one user or free traffic may hold of the engine at once.

`max_inflight` is a hard cap on the requests outstanding at the engine, whatever the batch
size; each test ends with an audit of the money against the answers.
"""

from __future__ import annotations

import asyncio
import threading

import httpx

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


def test_max_inflight_is_a_hard_cap_whatever_the_batch_size(ledger_db: MigratedDatabase) -> None:
    # Before: a batch closed while fewer than 10 were out took up to 64, whatever room was left.
    with running_server(
        ledger_db, max_inflight=10, batch_size=64, emulator_time_scale=0.5, max_wait_ms=50
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

        responses = asyncio.run(burst())
        most = watch.stop()
        assert [r.status_code for r in responses] == [200] * 40
        assert 1 <= most <= 10, f"{most:g} requests were at the engine at once"
        audit_money_against_answers(server.ledger, {f"many/r{i}": "served" for i in range(40)})
