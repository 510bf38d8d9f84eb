"""A client that leaves after its batch closed: its work stops, and it pays only for what it
got (docs/SPEC.md, "A client that leaves").

Three users share one batch of long generations and each client leaves at another moment:
after its first token (streamed), before its first token (streamed), and in the middle of a
whole answer it waits for. The engine stops all three within seconds, the one that left
before its first token is refunded (its request fee too), the others keep their charge and
fee, and none is `served`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.db_fixtures import MigratedDatabase
from tests.processes import emulated_sglang
from tests.server.harness import RunningServer, running_server
from tests.server.money_audit import audit_money_against_answers, net_charge

# Long, yet three of them fit the emulated engine's memory at once (it reserves each request's
# `max_new_tokens`), so none waits there for another.
_LONG = {"max_new_tokens": 6_000, "ignore_eos": True}


# Every request pays it besides its charge (docs/SPEC.md section 5).
_FEE = 1_000

# 60x slower than the emulated H100: a first token takes about half a second, which leaves
# room to leave before it; 6,000 tokens would take many minutes.
_TIME_SCALE = 60.0


@pytest.fixture(params=["embedded", "separate"])
def engine(request: pytest.FixtureRequest) -> Iterator[dict[str, Any]]:
    """The engine: the embedded emulator, or `emulate-sglang` in a process of its own, whose
    own load then shows that the request was aborted there (`/abort_request`)."""
    if request.param == "embedded":
        yield {"emulator_time_scale": _TIME_SCALE}
        return
    with emulated_sglang(time_scale=_TIME_SCALE) as url:
        yield {"engine_url": url, "tokenizer": "builtin"}


def _engine_busy(server: RunningServer) -> bool:
    text = httpx.get(f"{server.url}/metrics").text
    inflight = next(
        float(line.split()[1])
        for line in text.splitlines()
        if line.startswith("inference_auction_engine_inflight ")
    )
    if inflight > 0 or server.settings.engine_url is None:
        return inflight > 0
    loads = httpx.get(f"{server.settings.engine_url}/v1/loads").json()["loads"][0]
    return bool(loads["num_running_reqs"] or loads["num_waiting_reqs"])


async def _stream_until(
    client: httpx.AsyncClient, body: dict[str, object], chunks_wanted: int
) -> list[str]:
    """Read the stream's events until `chunks_wanted` chunks after the auction's, then leave."""
    events: list[str] = []
    async with client.stream("POST", "/generate", json={**body, "stream": True}) as response:
        assert response.status_code == 200
        async for line in response.aiter_lines():
            if line.startswith("data: "):
                events.append(line)
                if len(events) > chunks_wanted:
                    break
    return events


@pytest.mark.anyio
async def test_clients_that_leave_stop_their_work_and_pay_only_for_what_they_got(
    ledger_db: MigratedDatabase, engine: dict[str, Any]
) -> None:
    with running_server(
        ledger_db,
        **engine,
        batch_size=3,
        max_wait_ms=10_000,
        engine_stream_interval=1,
        request_fee_micros=_FEE,
    ) as server:
        keys = {name: server.create_user(name, budget=10_000_000) for name in ("al", "bo", "cy")}

        async def scenario() -> None:
            async with (
                server.async_client(keys["al"]) as al,
                server.async_client(keys["bo"]) as bo,
                server.async_client(keys["cy"]) as cy,
            ):
                first_token = asyncio.Event()

                async def after_first_token() -> None:
                    body = {"rid": "a", "text": "alpha " * 50, "bid": "2", "sampling_params": _LONG}
                    await _stream_until(al, body, 1)
                    first_token.set()

                async def before_first_token() -> None:
                    body = {"rid": "b", "text": "beta " * 50, "bid": "1", "sampling_params": _LONG}
                    events = await _stream_until(bo, body, 0)
                    assert '"auction"' in events[0] or "batch_id" in events[0]

                async def whole_answer() -> None:
                    body = {"rid": "c", "text": "gamma " * 50, "bid": "3", "sampling_params": _LONG}
                    waiting = asyncio.create_task(cy.post("/generate", json=body))
                    await first_token.wait()  # it goes first, so it has its own by then
                    await asyncio.sleep(0.2)
                    waiting.cancel()

                await asyncio.gather(after_first_token(), before_first_token(), whole_answer())

        await scenario()
        # Left running, the three generations would take minutes (6,000 tokens at 60x): a
        # bound of seconds tells them apart from stopped ones on a machine however loaded.
        left = time.monotonic()
        while _engine_busy(server):
            assert time.monotonic() - left < 5.0, "the engine still works for clients that left"
            time.sleep(0.05)

        def settled() -> bool:
            found = [server.ledger.find_request(f"{u}/{r}") for u, r in (("al", "a"), ("cy", "c"))]
            return all(f is not None and str(f.status) != "scheduled" for f in found)

        deadline = time.monotonic() + 10
        while not settled():
            assert time.monotonic() < deadline
            time.sleep(0.05)
        audit_money_against_answers(
            server.ledger, {"al/a": "abandoned", "bo/b": "failed", "cy/c": "abandoned"}
        )
        # Both paid for their priority over the others, and keep paying it.
        for name, rid in (("al", "a"), ("cy", "c")):
            found = server.ledger.find_request(f"{name}/{rid}")
            assert found is not None
            assert net_charge(server.ledger, name, found.batch_id) > 0
        # The request fee goes the way of the charge: kept after the first token, given back
        # to the request that left before it.
        for name, kept in (("al", _FEE), ("bo", 0), ("cy", _FEE)):
            fees = server.ledger.entries(name, kind="fee").entries
            assert -sum(e.amount_micros for e in fees) == kept, name
