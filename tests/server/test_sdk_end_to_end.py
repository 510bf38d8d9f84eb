"""The SDK's autobidding clients against the real server (embedded engine, real ledger)."""

from __future__ import annotations

import asyncio
import random
import threading
from collections import defaultdict
from collections.abc import Iterator

import httpx
import pytest

from inference_auctions.sdk import AsyncAuctionClient, AuctionClient, Budget
from tests.db_fixtures import MigratedDatabase
from tests.server.harness import RunningServer, running_server


@pytest.fixture
def server(ledger_db: MigratedDatabase) -> Iterator[RunningServer]:
    """The paper's batch-size slots: its budgets were sized for them. Under fixed slots the
    small batches here charge a fraction as much, the tight budget no longer binds, and which
    user is served first on average is a coin toss."""
    with running_server(ledger_db, pricing_rule="batch-size") as running:
        yield running


@pytest.mark.anyio
async def test_autobidders_with_different_budgets_never_overspend(server: RunningServer) -> None:
    budgets = {"tight": "0.4", "medium": "2", "loose": "50"}
    keys = {name: server.create_user(name, budget=100_000_000) for name in budgets}
    article = "Shared article: " + " ".join(f"fact{i}" for i in range(200))
    seen: dict[str, dict[str, int]] = defaultdict(dict)
    bids: dict[tuple[str, int], list[int]] = defaultdict(list)
    priorities: dict[str, list[float]] = defaultdict(list)

    async def run(name: str) -> tuple[int, float]:
        """The client's own view of its spend and its final multiplier."""
        async with AsyncAuctionClient(
            base_url=server.url, api_key=keys[name], budget=Budget(total=budgets[name], auctions=40)
        ) as client:
            await drive(name, client)
            return client.bidder.spent_micros, client.bidder.alpha

    async def drive(name: str, client: AsyncAuctionClient) -> None:
        rng = random.Random(name)

        async def one(index: int, wave: int) -> None:
            prompt = (article if index % 3 else f"{name} alone") + f" question {index}"
            value = f"{1 + rng.paretovariate(1.5):.6f}"
            result = await client.generate(prompt, value=value, max_new_tokens=4)
            seen[name][result.auction.batch_id] = result.auction.charge_micros
            bids[name, wave].append(result.auction.bid_micros)
            priorities[name].append(result.auction.priority)

        for start in range(0, 40, 8):  # waves of concurrent requests, as a busy client sends
            await asyncio.gather(*(one(i, start) for i in range(start, start + 8)))

    views = list(await asyncio.gather(*(run(name) for name in budgets)))
    for name, (client_spend, _) in zip(budgets, views, strict=True):
        entries = server.ledger.entries(name, limit=1000).entries
        ledger_spend = sum(-e.amount_micros for e in entries if e.kind in ("charge", "refund"))
        assert ledger_spend == sum(seen[name].values())  # once per batch, as reported
        assert ledger_spend == client_spend
        assert ledger_spend <= int(float(budgets[name]) * 1_000_000)
    # The guard: a wave's bids in flight never exceed what is left of the budget.
    assert all(sum(b) <= 400_000 for (name, _), b in bids.items() if name == "tight")
    # The loose budget bids its values, the tight one cannot: it is served later on average.
    mean = {name: sum(p) / len(p) for name, p in priorities.items()}
    assert mean["loose"] > mean["tight"]
    assert server.ledger.reconcile().ok


def test_a_retried_request_is_charged_once_by_the_real_server(server: RunningServer) -> None:
    key = server.create_user("retrier", budget=10_000_000)
    attempts: list[str] = []
    dropped = threading.Event()

    class DropFirstResponse(httpx.HTTPTransport):
        """Sends every request for real; loses the first /generate response on the way back."""

        def handle_request(self, request: httpx.Request) -> httpx.Response:
            response = super().handle_request(request)
            if request.url.path == "/generate":
                attempts.append(request.content.decode())
                if not dropped.is_set():
                    dropped.set()
                    response.read()
                    raise httpx.ReadError("connection lost after the server answered")
            return response

    with AuctionClient(
        base_url=server.url,
        api_key=key,
        budget=Budget(total="5", auctions=10),
        transport=DropFirstResponse(),
    ) as client:
        result = client.generate("charge me once", value="0.5", max_new_tokens=3)
    assert len(attempts) == 2 and attempts[0] == attempts[1]  # same rid, same bid
    charges = [e for e in server.ledger.entries("retrier").entries if e.kind == "charge"]
    holds = [e for e in server.ledger.entries("retrier").entries if e.kind == "hold"]
    assert len(holds) == 1
    assert sum(-c.amount_micros for c in charges) == result.auction.charge_micros
