"""The poisoned batch: a user adds a zero-bid request that is sure to fail to each batch.

Before per-request refunds, any failed request of a user refunded the user's whole charge for
the batch, so the poison made the rest of the user's requests free. Now a request longer than
the engine's context is refused at admission (400, no hold), and a generation that stalls is
refunded what its bid added to the charge: 0 for a zero bid. The served requests pay what
the auction charged them, and the ledger reconciles. Real server, real ledger (SQLite and
PostgreSQL).
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from tests.billing.helpers import get_hold
from tests.db_fixtures import MigratedDatabase
from tests.faults.faulty_sglang import MAX_MODEL_LEN, FaultySGLang
from tests.server.harness import RunningServer, running_server

GRANT = 100_000_000
ROUNDS = 4


def _money(server: RunningServer, user: str) -> tuple[int, int]:
    """(charged, refunded) micro-credits of the user, from the ledger's entries."""
    entries = server.ledger.entries(user, limit=1000).entries
    charged = sum(-e.amount_micros for e in entries if e.kind == "charge")
    refunded = sum(e.amount_micros for e in entries if e.kind == "refund")
    return charged, refunded


async def _round(
    server: RunningServer, keys: dict[str, str], bodies: dict[str, dict[str, Any]]
) -> dict[str, httpx.Response]:
    async def send(name: str) -> httpx.Response:
        user = name.split("-", maxsplit=1)[0]
        async with server.async_client(keys[user]) as client:
            return await client.post("/generate", json=bodies[name])

    replies = await asyncio.gather(*(send(name) for name in bodies))
    return dict(zip(bodies, replies, strict=True))


@pytest.mark.anyio
async def test_an_overlong_zero_bid_poison_is_refused_before_any_money_moves(
    ledger_db: MigratedDatabase,
) -> None:
    # The emulator's context is its KV capacity (300 tokens here); the poison is longer than
    # that but well under the server's own prompt limit.
    with running_server(
        ledger_db, emulator_cache_tokens=300, batch_size=2, max_wait_ms=3_000
    ) as server:
        keys = {user: server.create_user(user, budget=GRANT) for user in ("mallory", "bob")}
        reported = 0
        for k in range(ROUNDS):
            bodies = {
                "mallory-real": {
                    "input_ids": [1, 2, 3, 4 + k],
                    "bid": "0.5",
                    "rid": f"real-{k}",
                    "sampling_params": {"max_new_tokens": 4},
                },
                "mallory-poison": {
                    "input_ids": list(range(7, 407)),
                    "bid": "0",
                    "rid": f"poison-{k}",
                    "sampling_params": {"max_new_tokens": 4},
                },
                "bob-real": {
                    "input_ids": [1, 2, 9, 9 + k],
                    "bid": "0.3",
                    "rid": f"bob-{k}",
                    "sampling_params": {"max_new_tokens": 4},
                },
            }
            replies = await _round(server, keys, bodies)
            poison = replies["mallory-poison"]
            assert poison.status_code == 400, poison.text
            assert "longer than the model's context length (300 tokens)" in poison.text
            assert get_hold(server.ledger, f"mallory/poison-{k}") is None  # no hold, no money
            for name in ("mallory-real", "bob-real"):
                assert replies[name].status_code == 200, replies[name].text
            auction = replies["mallory-real"].json()["meta_info"]["auction"]
            assert auction["batch_size"] == 2  # the poison never joined the batch
            reported += auction["user_batch_charge_micros"]
        charged, refunded = _money(server, "mallory")
        assert charged == reported > 0
        assert refunded == 0
        # A prompt that fits but asks for more tokens than the context has left: SGLang's
        # second refusal, also before any money moves.
        with server.client(keys["bob"]) as client:
            too_long = client.post(
                "/generate",
                json={
                    "input_ids": list(range(250)),
                    "bid": "0.1",
                    "rid": "total",
                    "sampling_params": {"max_new_tokens": 60},
                },
            )
        assert too_long.status_code == 400
        assert "Requested token count exceeds the model's maximum context length" in too_long.text
        assert too_long.json()["error"]["param"] == "max_new_tokens"
        assert get_hold(server.ledger, "bob/total") is None
        assert server.ledger.reconcile().ok


@pytest.mark.anyio
async def test_a_stalling_zero_bid_poison_refunds_nothing(ledger_db: MigratedDatabase) -> None:
    faulty = FaultySGLang()
    with (
        faulty.serve() as engine_url,
        running_server(
            ledger_db,
            engine_url=engine_url,
            engine_stall_timeout_seconds=0.5,
            batch_size=3,
            max_wait_ms=3_000,
            # The poison rides in the bidders' batch (by default a zero bid waits until nothing
            # that pays is at the engine): the case where its failure could touch their charges.
            free_traffic="shared",
        ) as server,
    ):
        keys = {user: server.create_user(user, budget=GRANT) for user in ("mallory", "bob")}
        reported = {"mallory": 0, "bob": 0}
        for k in range(ROUNDS):
            faulty.modes[f"mallory/poison-{k}"] = "stall"
            bodies = {
                "mallory-real": {
                    "text": f"the real question number {k}",
                    "bid": "0.5",
                    "rid": f"real-{k}",
                    "sampling_params": {"max_new_tokens": 4},
                },
                "mallory-poison": {
                    "text": f"the real question number {k} stalls",
                    "bid": "0",
                    "rid": f"poison-{k}",
                    "sampling_params": {"max_new_tokens": 4},
                },
                "bob-real": {
                    "text": f"the real answer for {k}",
                    "bid": "0.2",
                    "rid": f"bob-{k}",
                    "sampling_params": {"max_new_tokens": 4},
                },
            }
            replies = await _round(server, keys, bodies)
            assert replies["mallory-poison"].status_code == 504, replies["mallory-poison"].text
            for name, user in (("mallory-real", "mallory"), ("bob-real", "bob")):
                assert replies[name].status_code == 200, replies[name].text
                auction = replies[name].json()["meta_info"]["auction"]
                assert auction["batch_size"] == 3  # the poison was in the batch
                reported[user] += auction["user_batch_charge_micros"]
                # mallory's only served request carries her whole charge (the poison's
                # marginal is 0).
                assert auction["request_charge_micros"] == auction["user_batch_charge_micros"]
            poison = server.ledger.find_request(f"mallory/poison-{k}")
            assert poison is not None and str(poison.status) == "failed"
        charged, refunded = _money(server, "mallory")
        assert charged == reported["mallory"] > 0
        assert refunded == 0  # the zero-bid poison's failure is worth nothing
        assert _money(server, "bob") == (reported["bob"], 0)
        assert server.ledger.reconcile().ok


def test_sglangs_context_length_is_refused_at_admission_too(ledger_db: MigratedDatabase) -> None:
    # Over HTTP the server learns the context length from SGLang's /tokenize (max_model_len).
    faulty = FaultySGLang()
    with faulty.serve() as engine_url, running_server(ledger_db, engine_url=engine_url) as server:
        key = server.create_user("mallory", budget=GRANT)
        with server.client(key) as client:
            reply = client.post(
                "/generate",
                json={"input_ids": [5] * MAX_MODEL_LEN, "bid": "0", "rid": "poison"},
            )
        assert reply.status_code == 400, reply.text
        assert f"longer than the model's context length ({MAX_MODEL_LEN} tokens)" in reply.text
        assert get_hold(server.ledger, "mallory/poison") is None
        assert faulty.received == []  # never dispatched
