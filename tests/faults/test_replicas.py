"""Two auction servers on one PostgreSQL ledger, and a client that sends one rid to both.

Each request's hold is claimed when its batch closes: the replica that settles second finds the
hold settled, and that request alone leaves its batch with a 409. Nobody else's request fails,
the rid is charged once, and the ledger reconciles.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from inference_auctions.billing import Ledger
from inference_auctions.server.settings import ServerSettings
from tests.billing.helpers import get_hold
from tests.db_fixtures import MigratedDatabase, migrated_database
from tests.server.harness import TEST_SETTINGS, serve_app

GRANT = 100_000_000
ROUNDS = 6
OTHERS = ("bob", "carol", "dave")


@pytest.fixture
def postgres_db(tmp_path: Path) -> Iterator[MigratedDatabase]:
    with migrated_database("postgres", tmp_path) as db:
        yield db


@pytest.mark.anyio
@pytest.mark.postgres
async def test_one_rid_sent_to_two_replicas_fails_nobody_else(
    postgres_db: MigratedDatabase,
) -> None:
    settings = ServerSettings(
        database_url=postgres_db.url, **{**TEST_SETTINGS, "batch_size": 4, "max_wait_ms": 30}
    )
    ledger = Ledger(postgres_db.new_engine())
    keys = {u: ledger.create_user(u, budget_micros=GRANT).api_key for u in ("alice", *OTHERS)}
    with serve_app(settings) as first, serve_app(settings) as second:

        async def send(url: str, user: str, rid: str, bid: str) -> httpx.Response:
            headers = {"Authorization": f"Bearer {keys[user]}"}
            body = {
                "text": f"{user} asks question {rid}",
                "bid": bid,
                "rid": rid,
                "sampling_params": {"max_new_tokens": 4},
            }
            async with httpx.AsyncClient(base_url=url, headers=headers, timeout=60) as client:
                return await client.post("/generate", json=body)

        async def round_(k: int) -> tuple[list[httpx.Response], list[httpx.Response]]:
            twice = [send(url, "alice", f"dup-{k}", "0.5") for url in (first, second)]
            others = [
                send(url, user, f"{user}-{k}-{n}", "0.3")
                for n, url in enumerate((first, second))
                for user in OTHERS
            ]
            replies = await asyncio.gather(*twice, *others)
            return list(replies[:2]), list(replies[2:])

        charged = 0
        for k in range(ROUNDS):
            dup, others = await round_(k)
            assert [r.status_code for r in others] == [200] * len(others), [
                r.text for r in others if r.status_code != 200
            ]
            # One replica serves the rid; the other refuses it, at admission (the hold is
            # already settled) or when its batch closes (the claim fails).
            assert sorted(r.status_code for r in dup) == [200, 409], [r.text for r in dup]
            served = next(r for r in dup if r.status_code == 200)
            charged += served.json()["meta_info"]["auction"]["user_batch_charge_micros"]
            for refused in (r for r in dup if r.status_code == 409):
                assert f"dup-{k}" in refused.text and "alice/dup" not in refused.text
            hold = get_hold(ledger, f"alice/dup-{k}")
            assert hold is not None and str(hold.state) == "settled"
    entries = ledger.entries("alice", limit=1000).entries
    assert sum(-e.amount_micros for e in entries if e.kind == "charge") == charged
    assert not [e for e in entries if e.kind == "refund"]
    assert ledger.balance("alice").held_micros == 0
    assert ledger.reconcile().ok
