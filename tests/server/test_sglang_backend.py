"""The auction server in front of an SGLang server over real HTTP.

The SGLang side is `inference-auction emulate-sglang` in its own process: the same HTTP
contract a real SGLang server has, so the server's SGLang client code is exercised for real.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.db_fixtures import MigratedDatabase
from tests.processes import emulated_sglang, free_port
from tests.server.harness import running_server


@pytest.fixture(scope="module")
def sglang_url() -> Iterator[str]:
    """An `emulate-sglang` process on a free loopback port."""
    with emulated_sglang(time_scale=0.002) as url:
        yield url


async def _burst(url: str, key: str, count: int) -> list[dict[str, Any]]:
    async def send() -> list[dict[str, Any]]:
        headers = {"Authorization": f"Bearer {key}"}
        async with httpx.AsyncClient(base_url=url, headers=headers, timeout=60) as client:
            replies = await asyncio.gather(
                *(
                    client.post(
                        "/generate",
                        json={
                            "text": f"Unrelated prompt {i} " * 10,
                            "bid": f"0.{i:02d}",
                            "sampling_params": {"max_new_tokens": 4},
                        },
                    )
                    for i in range(1, count + 1)
                )
            )
        assert all(r.status_code == 200 for r in replies), [r.text for r in replies]
        return [r.json() for r in replies]

    return await send()


@pytest.mark.anyio
@pytest.mark.parametrize("mode", ["priority", "ordered"])
async def test_batches_reach_sglang_in_auction_order(
    ledger_db: MigratedDatabase, sglang_url: str, mode: str
) -> None:
    with running_server(ledger_db, engine_url=sglang_url, engine_mode=mode) as server:
        key = server.create_user("alice", budget=100_000_000)
        responses = await _burst(server.url, key, 24)
        charged = {}
        by_batch: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for body in responses:
            auction = body["meta_info"]["auction"]
            by_batch[auction["batch_id"]].append(body)
            charged[auction["batch_id"]] = auction["charge_micros"]
        assert any(len(batch) > 1 for batch in by_batch.values())
        for batch in by_batch.values():
            batch.sort(key=lambda b: b["meta_info"]["auction"]["position"])
            # (arrival at SGLang, first token), in the auction's order.
            seen = [
                (
                    b["meta_info"]["request_received_ts"],
                    b["meta_info"]["request_received_ts"] + b["meta_info"]["first_token_latency"],
                )
                for b in batch
            ]
            if mode == "ordered":
                # Each is sent once the one before it has started: they arrive in order.
                assert [arrived for arrived, _ in seen] == sorted(arrived for arrived, _ in seen)
            # Nobody overtakes an earlier place that was already there. In priority mode a
            # batch is written at once on several connections, and SGLang reads them in its
            # own order (several batches at once, when each goes out ahead of its commit);
            # the server keeps the engine unsaturated here, so each starts as it arrives, and
            # the auction's order among waiting requests is `test_batching_sglang.py`'s.
            for earlier, (arrived, started) in enumerate(seen):
                for later_arrived, later_started in seen[earlier + 1 :]:
                    if arrived <= later_arrived:
                        assert started <= later_started, (earlier, seen)
        entries = server.ledger.entries("alice", limit=1000).entries
        assert sum(-e.amount_micros for e in entries if e.kind == "charge") == sum(charged.values())
        assert server.ledger.reconcile().ok
        # Flushing goes through to SGLang's own /flush_cache (idle now, so it flushes).
        admin = server.create_user("root", admin=True)
        flushed = httpx.post(
            server.url + "/flush_cache", headers={"Authorization": f"Bearer {admin}"}, timeout=30
        )
        assert flushed.status_code == 200, flushed.text


@pytest.mark.anyio
async def test_an_unreachable_engine_is_502_and_refunds(ledger_db: MigratedDatabase) -> None:
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens there: connections are refused
    with running_server(ledger_db, engine_url=dead) as server:
        keys = [server.create_user(name, budget=5_000_000) for name in ("ann", "ben")]

        async def both() -> list[httpx.Response]:
            async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
                return list(
                    await asyncio.gather(
                        *(
                            client.post(
                                "/generate",
                                headers={"Authorization": f"Bearer {key}"},
                                json={"input_ids": [1, 2, 3, i], "bid": f"0.{i + 1}"},
                            )
                            for i, key in enumerate(keys)
                        )
                    )
                )

        replies = await both()
        with httpx.Client(base_url=server.url, timeout=60) as client:
            text = client.post(
                "/generate",
                headers={"Authorization": f"Bearer {keys[0]}"},
                json={"text": "needs the engine's tokenizer", "bid": "0.3"},
            )
        assert text.status_code == 502 and "tokenize" in text.json()["error"]["message"]
        assert [r.status_code for r in replies] == [502, 502]
        assert all(r.json()["error"]["type"] == "engine_error" for r in replies)
        for name in ("ann", "ben"):
            assert server.ledger.balance(name).balance_micros == 5_000_000
            assert server.ledger.balance(name).held_micros == 0
        assert server.ledger.reconcile().ok
