"""The quickstart's race, against a real server: alice (0.30) and bob (0.10) send at once into
a 2-second window. What docs/quickstart.md and docs/concepts.md say it charges is what the
server charges, under the default 64 priority slots and under `--batch-size 2`."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from tests.db_fixtures import migrated_database
from tests.server.harness import RunningServer, running_server

DOCS = Path(__file__).parents[2] / "docs"


async def _race(server: RunningServer, keys: dict[str, str]) -> dict[str, Any]:
    async def send(name: str, bid: str) -> Any:
        async with server.async_client(keys[name]) as client:
            reply = await client.post("/generate", json={"text": "Tell me a joke", "bid": bid})
            assert reply.status_code == 200, reply.text
            return reply.json()["meta_info"]["auction"]

    alice, bob = await asyncio.gather(send("alice", "0.30"), send("bob", "0.10"))
    return {"alice": alice, "bob": bob}


def _words(page: Path) -> str:
    """The page with its line breaks and indents as single spaces."""
    return " ".join(page.read_text().split())


@pytest.mark.parametrize(("batch_size", "alice_pays"), [(2, 100_000), (64, 1_587)])
def test_the_quickstarts_race_charges_what_the_docs_say(
    tmp_path: Path, batch_size: int, alice_pays: int
) -> None:
    settings = {"batch_size": batch_size, "max_wait_ms": 2000, "max_inflight": 256}
    with migrated_database("sqlite", tmp_path) as db, running_server(db, **settings) as server:
        keys = {
            name: server.ledger.create_user(name, budget_micros=10_000_000, period="day").api_key
            for name in ("alice", "bob")
        }
        auction = asyncio.run(_race(server, keys))
    assert auction["alice"]["batch_id"] == auction["bob"]["batch_id"]
    assert auction["alice"]["position"] == 0 and auction["bob"]["position"] == 1
    assert auction["alice"]["request_charge_micros"] == alice_pays
    assert auction["bob"]["request_charge_micros"] == 0
    quickstart = _words(DOCS / "quickstart.md")
    if batch_size == 2:
        assert "serve --batch-size 2 --max-wait-ms 2000" in quickstart
        assert "alice (0.30) goes first and pays 0.10" in quickstart
    else:
        assert "the same race charges alice 0.001587 (0.10 / 63" in quickstart
        concepts = _words(DOCS / "concepts.md")
        assert "by default its `--batch-size`: **64**" in concepts
        assert "pushing a bid of 0.10 down one place costs 0.001587" in concepts
