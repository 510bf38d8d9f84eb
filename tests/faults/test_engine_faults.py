"""Engine faults against the real auction server: SGLang refuses, hangs, fails or cuts a stream.

The SGLang side is `FaultySGLang` on a loopback port. In every case the batch was settled before
dispatch, so the users were charged; the clients must get a clear 502/504 (or, streaming, an
`error` event and `[DONE]`), each user's charge for the batch must be refunded, nothing may stay
held, and the ledger must reconcile.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from tests.db_fixtures import MigratedDatabase
from tests.faults.faulty_sglang import FaultySGLang, Mode
from tests.processes import free_port
from tests.server.harness import RunningServer, running_server

GRANT = 10_000_000
USERS = ("alice", "bob")
BIDS = {"alice": "0.5", "bob": "0.2"}


@dataclass(frozen=True)
class Expected:
    """What the clients must see for a fault."""

    status: int
    error_type: str
    messages: tuple[str, ...]  # one of them is in the error message
    chunks: int  # engine chunks a streaming client receives before the error


# The server's stall deadline: no token for 0.5 s.
TIMED_OUT = ("produced nothing",)

FAULTS: dict[Mode, Expected] = {
    "error": Expected(502, "engine_error", ("SGLang answered 500",), 0),
    "hang": Expected(504, "engine_timeout", TIMED_OUT, 0),
    "cut": Expected(502, "engine_error", ("ended before the request finished",), 2),
    "reset": Expected(502, "engine_error", ("broke",), 2),
    "stall": Expected(504, "engine_timeout", TIMED_OUT, 1),
}


@dataclass
class Outcome:
    """What alice (not streaming) and bob (streaming) got back."""

    reply: httpx.Response
    events: list[Any]  # parsed `data:` events, `[DONE]` as the string


@pytest.fixture
def faulty() -> FaultySGLang:
    return FaultySGLang()


@pytest.fixture
def engine_server(
    ledger_db: MigratedDatabase, faulty: FaultySGLang
) -> Iterator[tuple[RunningServer, FaultySGLang]]:
    """The auction server in front of the faulty engine; a batch closes at two requests."""
    with (
        faulty.serve() as url,
        running_server(
            ledger_db,
            engine_url=url,
            engine_stall_timeout_seconds=0.5,
            batch_size=2,
            max_wait_ms=5_000,
        ) as server,
    ):
        yield server, faulty


async def _stream_events(client: httpx.AsyncClient, body: dict[str, Any]) -> list[Any]:
    events: list[Any] = []
    async with client.stream("POST", "/generate", json={**body, "stream": True}) as response:
        assert response.status_code == 200, await response.aread()
        async for line in response.aiter_lines():
            if line.startswith("data:"):
                payload = line[len("data:") :].strip()
                events.append(payload if payload == "[DONE]" else json.loads(payload))
    return events


async def _contest(server: RunningServer, keys: dict[str, str], tag: str) -> Outcome:
    """alice and bob, one request each, arriving together: one batch of two."""

    async def both() -> Outcome:
        async with server.async_client(keys["alice"]) as a, server.async_client(keys["bob"]) as b:
            reply, events = await asyncio.gather(
                a.post(
                    "/generate",
                    json={
                        "input_ids": [11, 12, 13, 14],
                        "bid": BIDS["alice"],
                        "rid": f"{tag}-a",
                        "sampling_params": {"max_new_tokens": 6},
                    },
                ),
                _stream_events(
                    b,
                    {
                        "text": "bob asks something else entirely",
                        "bid": BIDS["bob"],
                        "rid": f"{tag}-b",
                        "sampling_params": {"max_new_tokens": 6},
                    },
                ),
            )
        return Outcome(reply, events)

    return await both()


def _assert_refunded(server: RunningServer, users: tuple[str, ...] = USERS) -> int:
    """Every charge refunded, nothing held, the ledger reconciles; returns the total charged."""
    total = 0
    for user in users:
        entries = server.ledger.entries(user, limit=1000).entries
        charged = sum(-e.amount_micros for e in entries if e.kind == "charge")
        refunded = sum(e.amount_micros for e in entries if e.kind == "refund")
        assert charged == refunded, (user, charged, refunded)
        balance = server.ledger.balance(user)
        assert (balance.balance_micros, balance.held_micros) == (GRANT, 0)
        total += charged
    assert server.ledger.reconcile().ok
    return total


@pytest.mark.anyio
@pytest.mark.parametrize("mode", list(FAULTS))
async def test_an_engine_fault_is_a_clear_error_and_refunds_the_batch(
    engine_server: tuple[RunningServer, FaultySGLang], mode: Mode
) -> None:
    server, faulty = engine_server
    expected = FAULTS[mode]
    keys = {user: server.create_user(user, budget=GRANT) for user in USERS}
    faulty.mode = mode
    started = time.monotonic()
    outcome = await _contest(server, keys, mode)
    elapsed = time.monotonic() - started

    # alice waited for the whole answer: an error response that says what happened.
    assert outcome.reply.status_code == expected.status, outcome.reply.text
    error = outcome.reply.json()["error"]
    assert error["type"] == expected.error_type
    assert any(m in error["message"] for m in expected.messages), error
    assert f"{mode}-a" in error["message"]
    assert f"alice/{mode}-a" not in error["message"]  # the client's rid, not the ledger's id
    if mode == "error":
        assert "illegal memory access" in error["message"]  # the engine's own words

    # bob streamed: the auction object, the chunks the engine sent, an error event, [DONE].
    events = outcome.events
    assert events[-1] == "[DONE]"
    assert events[-2]["error"]["type"] == expected.error_type
    assert any(m in events[-2]["error"]["message"] for m in expected.messages), events[-2]
    auction = events[0]["meta_info"]["auction"]
    assert auction["batch_size"] == 2
    assert len(events) == 3 + expected.chunks
    assert [len(e["output_ids"]) for e in events[1:-2]] == list(range(1, expected.chunks + 1))

    # Both were dispatched once, in the auction's order, and nothing was retried.
    assert sorted(r.rid for r in faulty.received) == [f"alice/{mode}-a", f"bob/{mode}-b"]
    if expected.status == 504:
        assert elapsed < 5, "the engine deadline bounds a hung request"

    # The ledger: the batch settled, then every charge in it came back.
    for user, suffix in (("alice", "a"), ("bob", "b")):
        request = server.ledger.find_request(f"{user}/{mode}-{suffix}")
        assert request is not None and request.batch_id == auction["batch_id"]
        assert str(request.status) == "failed"
    assert _assert_refunded(server) > 0, "VCG charged someone, so a refund was needed"


@pytest.mark.anyio
async def test_an_engine_that_goes_away_and_comes_back(
    ledger_db: MigratedDatabase, faulty: FaultySGLang
) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with running_server(ledger_db, engine_url=url, batch_size=2, max_wait_ms=5_000) as server:
        keys = {user: server.create_user(user, budget=GRANT) for user in USERS}
        with faulty.serve(port):
            served = await _contest(server, keys, "before")
        assert served.reply.status_code == 200
        assert served.events[-1] == "[DONE]" and "error" not in served.events[-2]
        paid = {user: GRANT - server.ledger.balance(user).balance_micros for user in USERS}
        assert sum(paid.values()) > 0

        # Nothing listens on the port now: connections are refused.
        with httpx.Client(base_url=server.url, timeout=10) as client:
            health = client.get("/health")
        assert health.status_code == 503 and health.json()["status"] == "engine unavailable"
        refused = await _contest(server, keys, "refused")
        assert refused.reply.status_code == 502
        assert "unreachable" in refused.reply.json()["error"]["message"]
        assert refused.events[-2]["error"]["type"] == "engine_error"
        assert refused.events[-1] == "[DONE]"
        for user in USERS:  # only the refused batch was refunded; the served one stays paid
            balance = server.ledger.balance(user)
            assert (balance.balance_micros, balance.held_micros) == (GRANT - paid[user], 0)
        assert server.ledger.reconcile().ok

        # SGLang is back on the same address: the next batch is served and charged again.
        with faulty.serve(port):
            again = await _contest(server, keys, "after")
        assert again.reply.status_code == 200 and "error" not in again.events[-2]
        for user, suffix in (("alice", "a"), ("bob", "b")):
            refused_request = server.ledger.find_request(f"{user}/refused-{suffix}")
            served_request = server.ledger.find_request(f"{user}/after-{suffix}")
            assert refused_request is not None and str(refused_request.status) == "failed"
            assert served_request is not None and str(served_request.status) == "served"
        assert server.ledger.reconcile().ok
