"""Load: 200 concurrent clients of 20 users for a bounded time, then the books must balance."""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter, defaultdict
from typing import Any

import httpx
import pytest

from tests.db_fixtures import MigratedDatabase
from tests.server.harness import running_server

CLIENTS = 200
USERS = 20
SECONDS = 4.0


@pytest.mark.anyio
async def test_two_hundred_clients_and_the_ledger_reconciles_exactly(
    ledger_db: MigratedDatabase,
) -> None:
    settings = {"batch_size": 32, "max_inflight": 64, "emulator_time_scale": 0.001}
    with running_server(ledger_db, **settings) as server:
        keys = {
            f"u{i:02d}": server.create_user(f"u{i:02d}", budget=1_000_000_000) for i in range(USERS)
        }
        reported: dict[tuple[str, str], int] = {}
        statuses: Counter[int] = Counter()
        articles = [f"Article {a}: " + " ".join(f"w{a}x{i}" for i in range(120)) for a in range(8)]

        async def client(index: int, limits: httpx.Limits) -> None:
            user = f"u{index % USERS:02d}"
            rng = random.Random(index)
            headers = {"Authorization": f"Bearer {keys[user]}"}
            deadline = time.monotonic() + SECONDS
            async with httpx.AsyncClient(
                base_url=server.url, headers=headers, timeout=120, limits=limits
            ) as http:
                number = 0
                while time.monotonic() < deadline:
                    number += 1
                    prompt = rng.choice(articles) + f" Q{index}-{number}?"
                    reply = await http.post(
                        "/generate",
                        json={
                            "text": prompt,
                            "bid": f"{rng.random():.6f}",
                            "sampling_params": {"max_new_tokens": 4},
                        },
                    )
                    statuses[reply.status_code] += 1
                    if reply.status_code == 200:
                        record(user, reply.json())

        def record(user: str, body: dict[str, Any]) -> None:
            auction = body["meta_info"]["auction"]
            key = (user, auction["batch_id"])
            assert reported.setdefault(key, auction["charge_micros"]) == auction["charge_micros"]

        async def everyone() -> None:
            limits = httpx.Limits(max_connections=1)
            await asyncio.gather(*(client(i, limits) for i in range(CLIENTS)))

        await everyone()

        assert set(statuses) == {200}, statuses
        assert statuses[200] >= CLIENTS  # every client got through at least once
        print(f"{statuses[200]} requests in {SECONDS} s from {CLIENTS} clients")
        in_ledger: dict[tuple[str, str], int] = defaultdict(int)
        for user in keys:
            cursor = None
            while True:
                page = server.ledger.entries(user, kind="charge", limit=200, cursor=cursor)
                for entry in page.entries:
                    assert entry.batch_id is not None
                    in_ledger[user, entry.batch_id] += -entry.amount_micros
                if page.next_cursor is None:
                    break
                cursor = page.next_cursor
            balance = server.ledger.balance(user)
            assert balance.held_micros == 0 and balance.available_micros >= 0
        assert dict(in_ledger) == {k: v for k, v in reported.items() if v > 0}
        report = server.ledger.reconcile()
        assert report.ok and report.accounts_checked == USERS
