"""`GET /v1/dashboard/account` costs its own key: an answer is shared by a user's callers for a
second, and the reads it does cost the user's own budget of server time (429 past it), so that
a flood of it leaves the other users alone. On both ledger backends, ending with the money
audit of the traffic that made the accounts."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from inference_auctions.billing import Ledger
from inference_auctions.server.dashboard import account_reads
from tests.dashboard.seeding import send_traffic
from tests.db_fixtures import MigratedDatabase
from tests.server.harness import running_server
from tests.server.money_audit import audit_money_against_answers


def _served(server_ledger: Ledger, names: list[str]) -> dict[str, str]:
    return {
        f"{name}/{entry.request_id.split('/', 1)[1]}": "served"
        for name in names
        for entry in server_ledger.entries(name, limit=100).entries
        if entry.kind == "hold" and entry.request_id
    }


def test_a_flood_of_account_views_costs_its_own_key(
    ledger_db: MigratedDatabase, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Before: every call read the account again (36 ms on a busy account, more as it grows),
    # and only the count of requests was limited (200/s), which such reads never reach.
    monkeypatch.setattr(account_reads, "COST_BURST", 1e-9)  # one read spends it
    monkeypatch.setattr(account_reads, "COST_RATE", 1e-9)
    monkeypatch.setattr(account_reads, "KEPT_SECONDS", 0.0)  # every call would read
    with running_server(ledger_db) as server:
        keys = {name: server.create_user(name) for name in ("flood", "other")}
        send_traffic(server, keys, rounds=1)
        with server.client(keys["flood"]) as flood, server.client(keys["other"]) as other:
            statuses = [flood.get("/v1/dashboard/account").status_code for _ in range(4)]
            assert statuses == [200, 429, 429, 429]
            refused = flood.get("/v1/dashboard/account")
            assert int(refused.headers["Retry-After"]) >= 1
            assert "account view" in refused.json()["error"]["message"]
            mine = other.get("/v1/dashboard/account")  # another key is not held back
            assert mine.status_code == 200 and mine.json()["requests"]["served"] == 2
        audit_money_against_answers(server.ledger, _served(server.ledger, list(keys)))


@pytest.mark.anyio
async def test_callers_of_one_account_share_one_read(
    ledger_db: MigratedDatabase, monkeypatch: pytest.MonkeyPatch
) -> None:
    reads = 0
    real = Ledger.account_activity

    def counted(self: Ledger, *args: Any, **kwargs: Any) -> Any:
        nonlocal reads
        reads += 1
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Ledger, "account_activity", counted)
    monkeypatch.setattr(account_reads, "KEPT_SECONDS", 30.0)
    with running_server(ledger_db) as server:
        key = server.create_user("flood")
        # The helper drives its own event loop; a thread keeps it off this test's loop.
        await asyncio.to_thread(send_traffic, server, {"flood": key}, rounds=1)

        async def flood() -> list[httpx.Response]:
            async with server.async_client(key) as client:
                return await asyncio.gather(
                    *(client.get("/v1/dashboard/account") for _ in range(40))
                )

        answers = await flood()
        assert {a.status_code for a in answers} == {200}
        assert reads == 1, "40 concurrent calls of one account read it more than once"
        audit_money_against_answers(server.ledger, _served(server.ledger, ["flood"]))
