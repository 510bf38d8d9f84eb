"""Threads and asyncio tasks sharing one bidder or one client."""

from __future__ import annotations

import asyncio
import random
import threading
from concurrent.futures import ThreadPoolExecutor
from fractions import Fraction

import pytest

from inference_auctions.sdk import AsyncAuctionClient, AuctionClient, Budget, PacingBidder

from .conftest import BASE_URL, async_transport, transport
from .fake_server import API_KEY, FakeServer

CREDIT = 1_000_000
# The clients here spend their budgets to the end and then bid 0, which warns.
pytestmark = pytest.mark.filterwarnings("ignore::inference_auctions.sdk.BudgetExhaustedWarning")


def test_threads_sharing_a_bidder_never_overspend() -> None:
    budget = Budget(total="5", auctions=200)
    bidder = PacingBidder(budget)
    lock = threading.Lock()
    charged = [0]

    def worker(seed: int) -> None:
        rng = random.Random(seed)
        for i in range(300):
            (bid,) = bidder.bid([rng.randrange(0, CREDIT)])
            if rng.random() < 0.1:
                bidder.settle_unknown(bid)
                charge = bid
            else:
                charge = bid  # adversarial: the whole bid, every time
                bidder.settle(f"{seed}-{i}", charge, reserved=bid)
            with lock:
                charged[0] += charge
                assert charged[0] <= budget.total_micros

    with ThreadPoolExecutor(16) as pool:
        list(pool.map(worker, range(16)))
    assert bidder.in_flight_micros == 0
    assert bidder.spent_micros == charged[0] <= budget.total_micros


def test_concurrent_reports_of_one_batch_update_once() -> None:
    reference = PacingBidder(Budget(total="100", auctions=100))
    reference.release(reference.bid([CREDIT])[0])
    reference.observe("b", 16 * CREDIT)

    bidder = PacingBidder(Budget(total="100", auctions=100))
    barrier = threading.Barrier(16)

    def request(i: int) -> bool:
        (bid,) = bidder.bid([CREDIT])
        barrier.wait()
        return bidder.settle("b", 16 * CREDIT, reserved=bid, rid=f"r{i}")

    with ThreadPoolExecutor(16) as pool:
        firsts = list(pool.map(request, range(16)))
    assert firsts.count(True) == 1
    assert bidder.spent_micros == 16 * CREDIT
    assert bidder.auctions == 1
    assert bidder.mu == reference.mu


@pytest.mark.parametrize("share", [Fraction(1), Fraction(1, 3)])
def test_threads_sharing_a_client(share: Fraction) -> None:
    server = FakeServer(batch_size=4, charge_share=share, wait=0.05)
    budget = Budget(total="2", auctions=40)
    # Spending the budget to the last micro-credit is the point: then bid 0, do not raise.
    client = AuctionClient(
        BASE_URL,
        API_KEY,
        budget=budget,
        transport=transport(server),
        sync_interval=None,
        on_budget_exhausted="bid_zero",
    )

    def user(seed: int) -> None:
        rng = random.Random(seed)
        for _ in range(20):
            client.generate("prompt", value=f"0.{rng.randrange(10, 99)}")

    with client, ThreadPoolExecutor(8) as pool:
        list(pool.map(user, range(8)))
    assert len(server.attempts_on("/generate")) == 160
    assert len(server.attempts_on("/v1/spend")) == 1  # synced once, not per thread
    # The server never saw committed bids beyond the budget, and the SDK's books match its
    # charges even though every batch was reported by up to four responses.
    assert server.max_committed <= budget.total_micros
    assert client.bidder.spent_micros == server.total_charged <= budget.total_micros
    assert client.bidder.auctions == len(server.batches)
    assert client.bidder.in_flight_micros == 0
    assert max(len(b.bids) for b in server.batches) == 4


@pytest.mark.anyio
async def test_tasks_sharing_an_async_client() -> None:
    server = FakeServer(batch_size=4, wait=0.05)
    budget = Budget(total="2", auctions=40)

    async with AsyncAuctionClient(
        BASE_URL,
        API_KEY,
        budget=budget,
        transport=async_transport(server),
        sync_interval=None,
        on_budget_exhausted="bid_zero",
    ) as client:

        async def user(seed: int) -> None:
            rng = random.Random(seed)
            for _ in range(5):
                await client.generate("prompt", value=f"0.{rng.randrange(10, 99)}")

        await asyncio.gather(*(user(seed) for seed in range(32)))
    assert len(server.attempts_on("/generate")) == 160
    assert len(server.attempts_on("/v1/spend")) == 1
    assert server.max_committed <= budget.total_micros
    assert client.bidder.spent_micros == server.total_charged <= budget.total_micros
    assert client.bidder.auctions == len(server.batches)
    assert client.bidder.in_flight_micros == 0
    assert max(len(b.bids) for b in server.batches) == 4
