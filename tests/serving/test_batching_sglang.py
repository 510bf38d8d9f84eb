"""Work-conserving batching, end to end: a late high bidder overtakes low bidders that wait.

The auction server runs on a real port in front of `emulate-sglang` in its own process, at the
modelled GPU's speed. A long prompt keeps the engine saturated (more than a prefill step's worth
of prompt tokens without a first token), low bidders arrive and then a high bidder. The server
holds them back while the engine is saturated, so the next auction orders all of them and the
high bidder's first token comes before theirs. With the engine fed as before (every request
sent on within `max_wait_ms`, up to `max_inflight`), the low bidders already queue inside the
engine in batch order, and the high bidder comes last.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from tests.db_fixtures import MigratedDatabase
from tests.processes import emulated_sglang
from tests.server.harness import running_server

LOW_BIDDERS = 6
# One low bidder per prefill step (two do not fit in SGLang's 8192-token chunk), so each one's
# first token is its own instant.
LOW_TOKENS = 5_000
# At model speed a 16k-token prefill takes 1.6 s: everyone else arrives while it runs.
BUSY_TOKENS = 16_000
# ...and then decodes for about 2.5 s more.
BUSY_OUTPUT = 100

WORK_CONSERVING: dict[str, Any] = {"max_wait_ms": 0, "saturation_tokens": 8_192}
# main's policy before work-conserving batching: a 50 ms window, and the engine counts as
# saturated only at `max_inflight`.
ENGINE_FED: dict[str, Any] = {
    "scheduling": "batches",
    "max_wait_ms": 50,
    "saturation_tokens": 10**9,
    "saturation_requests": 10**9,
}


@pytest.fixture(scope="module")
def sglang_url() -> Iterator[str]:
    """An `emulate-sglang` process on a free port, running at the modelled GPU's speed."""
    with emulated_sglang(time_scale=1.0) as url:
        yield url


def _wait_for(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 30
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting until {what}")
        time.sleep(0.005)


def _engine_load(sglang_url: str) -> dict[str, Any]:
    loads = httpx.get(sglang_url + "/v1/loads", timeout=5).json()
    rank: dict[str, Any] = loads["loads"][0] if "loads" in loads else loads
    return rank


def _gauge(server_url: str, name: str) -> float:
    text = httpx.get(server_url + "/metrics", timeout=5).text
    match = re.search(rf"^inference_auction_{name} (\S+)$", text, re.MULTILINE)
    assert match is not None
    return float(match[1])


def _first_token_at(body: dict[str, Any]) -> float:
    """When the engine produced the request's first token, on the engine's clock."""
    meta = body["meta_info"]
    return float(meta["request_received_ts"] + meta["first_token_latency"])


async def _contest(
    server_url: str, sglang_url: str, key: str, base: int, work_conserving: bool
) -> tuple[dict[str, Any], dict[str, Any], list[dict[str, Any]]]:
    """Saturate the engine, send the low bidders, then the high bidder; return the bodies."""

    def body(first: int, length: int, bid: str, new_tokens: int = 2) -> dict[str, Any]:
        prompt = list(range(first, first + length))  # distinct: nothing is cached
        return {"input_ids": prompt, "bid": bid, "sampling_params": {"max_new_tokens": new_tokens}}

    async def run() -> tuple[dict[str, Any], dict[str, Any], list[dict[str, Any]]]:
        headers = {"Authorization": f"Bearer {key}"}
        async with httpx.AsyncClient(base_url=server_url, headers=headers, timeout=120) as client:
            # It decodes long after its first token: the backlog must go at that first token.
            busy_body = body(base, BUSY_TOKENS, "1", new_tokens=BUSY_OUTPUT)
            busy = asyncio.create_task(client.post("/generate", json=busy_body))
            await asyncio.to_thread(
                _wait_for, lambda: _engine_load(sglang_url)["num_running_reqs"] >= 1, "busy runs"
            )
            lows = [
                asyncio.create_task(
                    client.post(
                        "/generate",
                        json=body(base + BUSY_TOKENS + i * LOW_TOKENS, LOW_TOKENS, "0.01"),
                    )
                )
                for i in range(LOW_BIDDERS)
            ]
            # Every low bidder has arrived and waits: in the pool, or sent to the engine.
            gauge, count = (
                ("queue_length", LOW_BIDDERS)
                if work_conserving
                else ("engine_inflight", 1 + LOW_BIDDERS)
            )
            await asyncio.to_thread(
                _wait_for, lambda: _gauge(server_url, gauge) == count, "the low bidders wait"
            )
            assert not busy.done()
            high_body = body(base + BUSY_TOKENS + LOW_BIDDERS * LOW_TOKENS, LOW_TOKENS, "5")
            high = await client.post("/generate", json=high_body)
            replies = [await low for low in lows]
            busy_reply = await busy
        assert busy_reply.status_code == 200, busy_reply.text
        assert high.status_code == 200, high.text
        assert all(r.status_code == 200 for r in replies), [r.text for r in replies]
        return busy_reply.json(), high.json(), [r.json() for r in replies]

    return await run()


@pytest.mark.anyio
@pytest.mark.parametrize("work_conserving", [True, False], ids=["work-conserving", "engine-fed"])
async def test_a_late_high_bidder_overtakes_waiting_low_bidders(
    ledger_db: MigratedDatabase, sglang_url: str, work_conserving: bool
) -> None:
    base = 1_000 if work_conserving else 500_000  # no prefix of one run is cached for the other
    policy = WORK_CONSERVING if work_conserving else ENGINE_FED
    settings = {"batch_size": 64, "max_inflight": 256, "deferral": False, **policy}
    with running_server(ledger_db, engine_url=sglang_url, **settings) as server:
        key = server.create_user("alice", budget=100_000_000)
        busy, high, lows = await _contest(server.url, sglang_url, key, base, work_conserving)
    high_first = _first_token_at(high)
    low_firsts = sorted(_first_token_at(low) for low in lows)
    if work_conserving:
        # The low bidders waited in the pool: the clearing at the engine's first opening put the
        # high bidder at the head, and none of them in an earlier batch (batch ids sort by time).
        auction = high["meta_info"]["auction"]
        assert auction["position"] == 0
        assert all(low["meta_info"]["auction"]["batch_id"] >= auction["batch_id"] for low in lows)
        assert high_first < low_firsts[0], (high_first, low_firsts)
        # The pool woke at the long request's first token, not at its end.
        meta = busy["meta_info"]
        assert high_first < meta["request_received_ts"] + meta["e2e_latency"]
    else:
        # The low bidders queued inside the engine in batch order: nobody is overtaken.
        assert high_first > low_firsts[-1], (high_first, low_firsts)
