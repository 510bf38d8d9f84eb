"""Free requests cannot take the server's memory: an answer costs memory linear in its length,
and answers in flight share a budget beyond which a request is refused with 503 and
Retry-After, never the process killed.

The server runs in a process of its own, so that its resident memory is its alone.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from inference_auctions.billing import Ledger
from tests.db_fixtures import MigratedDatabase
from tests.processes import free_port, wait_until_healthy
from tests.server.harness import running_server
from tests.server.money_audit import audit_money_against_answers

_CLI = [sys.executable, "-m", "inference_auctions.server.cli"]


@contextmanager
def _server(
    db: MigratedDatabase, log: Path, **settings: object
) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    port = free_port()
    env = {**os.environ, "INFERENCE_AUCTION_DATABASE_URL": db.url}
    env["INFERENCE_AUCTION_PORT"] = str(port)
    env["INFERENCE_AUCTION_EMULATOR_TIME_SCALE"] = "0.01"
    env["INFERENCE_AUCTION_RUN_JOBS"] = "false"
    for name, value in settings.items():
        env[f"INFERENCE_AUCTION_{name.upper()}"] = str(value)
    url = f"http://127.0.0.1:{port}"
    with log.open("ab") as output:
        process = subprocess.Popen(
            [*_CLI, "serve", "--log-level", "warning"], env=env, stdout=output, stderr=output
        )
    try:
        wait_until_healthy(url, process)
        yield url, process
    finally:
        process.terminate()
        process.wait(30)


def _rss_mib(pid: int, field: str = "VmRSS") -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no {field}")


async def _read_stream(client: httpx.AsyncClient, body: dict[str, object]) -> int:
    """Read a streamed answer to its end; the number of tokens its last chunk says it has."""
    last = ""
    async with client.stream("POST", "/generate", json={**body, "stream": True}) as response:
        assert response.status_code == 200, await response.aread()
        async for line in response.aiter_lines():
            if line.startswith("data: {"):
                last = line
    return int(json.loads(last[6:])["meta_info"]["completion_tokens"])


@pytest.mark.anyio
async def test_long_free_answers_cost_memory_linear_in_their_length(
    ledger_db: MigratedDatabase, tmp_path: Path
) -> None:
    # Before: every streamed chunk's cumulative text and ids stayed with the request, so 4
    # answers of 4,000 tokens kept about 4 x 4,000^2 / 2 ids (the server grew by 400 MiB).
    ledger = Ledger(ledger_db.new_engine())
    key = ledger.create_user("free", budget_micros=0).api_key
    with _server(ledger_db, tmp_path / "server.log") as (url, process):
        headers = {"Authorization": f"Bearer {key}"}

        async def attack() -> list[int]:
            async with httpx.AsyncClient(base_url=url, headers=headers, timeout=120) as client:
                await _read_stream(client, {"text": "warm up", "bid": 0})
                before = _rss_mib(process.pid)
                long = {"max_new_tokens": 4_000, "ignore_eos": True}
                tokens = await asyncio.gather(
                    *(
                        _read_stream(
                            client, {"rid": f"r{i}", "text": f"essay {i}", "sampling_params": long}
                        )
                        for i in range(4)
                    )
                )
                grown = _rss_mib(process.pid) - before
                assert grown < 40, f"the server grew by {grown:.0f} MiB for 4 answers"
                return tokens

        assert await attack() == [4_000] * 4  # whole answers
    audit_money_against_answers(ledger, {f"free/r{i}": "served" for i in range(4)})


@pytest.mark.anyio
async def test_answers_beyond_the_memory_budget_wait_their_turn_as_503s(
    ledger_db: MigratedDatabase,
) -> None:
    # A budget of 1 MiB: four answers of 2,000 tokens at most (128 bytes a token reserved).
    with running_server(
        ledger_db, answer_memory_mib=1, emulator_time_scale=0.05, batch_size=64
    ) as server:
        key = server.create_user("free", budget=0)

        async def flood() -> list[httpx.Response]:
            async with server.async_client(key) as client:
                long = {"max_new_tokens": 2_000, "ignore_eos": True}
                return list(
                    await asyncio.gather(
                        *(
                            client.post(
                                "/generate",
                                json={"rid": f"r{i}", "text": f"q {i}", "sampling_params": long},
                            )
                            for i in range(12)
                        )
                    )
                )

        responses = await flood()
        statuses = sorted(r.status_code for r in responses)
        assert set(statuses) == {200, 503}, statuses
        assert statuses.count(200) <= 4
        refused = [r for r in responses if r.status_code == 503]
        assert all(r.headers["Retry-After"] == "1" for r in refused)
        assert "answer_memory_mib" in refused[0].json()["error"]["message"]
        # Too long for the whole budget: refused by name, even on an idle server.
        alone = httpx.post(
            f"{server.url}/generate",
            headers={"Authorization": f"Bearer {key}"},
            json={"text": "q", "sampling_params": {"max_new_tokens": 9_000}},
        )
        assert alone.status_code == 503
        served = {
            f"free/{r.json()['meta_info']['id']}": "served"
            for r in responses
            if r.status_code == 200
        }
        audit_money_against_answers(server.ledger, served)
        for i in range(12):
            if f"free/r{i}" not in served:
                assert server.ledger.find_request(f"free/r{i}") is None  # never settled
