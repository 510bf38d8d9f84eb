"""The ledger writer's thread lane: one thread, in order, every outcome handed back once.

`ThreadLane` replaced a one-worker `ThreadPoolExecutor`; these are the executor's guarantees
that the ledger writer relies on, checked on the lane itself, with a real ledger on an SQLite
file: calls run one at a time in the order given, on a thread that is not the event loop's;
what a call raises reaches its caller as it was (a `StopIteration`, which an asyncio future
refuses, as a `RuntimeError` caused by it); a caller cancelled before its call started
gets nothing run; closing finishes what was sent and refuses what comes after.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from inference_auctions.billing import HoldInput, Ledger
from inference_auctions.server.ledger_writer.writer import ThreadLane
from tests.db_fixtures import migrated_database


@pytest.fixture
def ledger(tmp_path: Path) -> Iterator[Ledger]:
    with migrated_database("sqlite", tmp_path) as db:
        yield Ledger(db.engine)


@pytest.mark.anyio
async def test_calls_run_one_at_a_time_in_order_off_the_event_loop(ledger: Ledger) -> None:
    ran: list[tuple[int, int]] = []
    running = 0

    def work(index: int) -> int:
        nonlocal running
        running += 1
        assert running == 1, "two calls of one lane ran at once"
        time.sleep(0.001 if index % 3 == 0 else 0)
        ran.append((index, threading.get_ident()))
        running -= 1
        return index * index

    async def main() -> list[int]:
        lane = ThreadLane(ledger, "test-lane")
        try:
            return await asyncio.gather(*(lane.call(work, index) for index in range(40)))
        finally:
            await lane.close()

    results = await main()
    assert results == [index * index for index in range(40)]
    assert [index for index, _ in ran] == list(range(40))
    threads = {thread for _, thread in ran}
    assert len(threads) == 1 and threading.get_ident() not in threads


@pytest.mark.anyio
async def test_a_group_commit_runs_on_the_ledger_and_its_refusal_comes_back_as_raised(
    ledger: Ledger,
) -> None:
    ledger.create_user("lane-user", budget_micros=1_000)

    lane = ThreadLane(ledger, "test-lane")
    try:
        outcome = await lane.commit([HoldInput("lane-user", "r1", 600)], [], [])
        assert [view.amount_micros for view in outcome.placed] == [600]  # type: ignore[union-attr]
        assert outcome.available == {"lane-user": 400}
        with pytest.raises(ValueError, match="not a rid"):
            await lane.call(_raise, ValueError("not a rid"))
    finally:
        await lane.close()
    assert ledger.balance("lane-user").held_micros == 600


def _raise(error: Exception) -> None:
    raise error


@pytest.mark.anyio
async def test_a_stop_iteration_reaches_its_caller_as_a_runtime_error(ledger: Ledger) -> None:
    lane = ThreadLane(ledger, "test-lane")
    try:
        with pytest.raises(RuntimeError, match="StopIteration") as raised:
            await asyncio.wait_for(lane.call(_raise, StopIteration("empty")), 5)
        assert isinstance(raised.value.__cause__, StopIteration)
    finally:
        await lane.close()


@pytest.mark.anyio
async def test_a_caller_cancelled_before_its_call_started_gets_nothing_run(ledger: Ledger) -> None:
    release = threading.Event()
    ran: list[str] = []

    def blocking() -> None:
        release.wait(5)
        ran.append("first")

    lane = ThreadLane(ledger, "test-lane")
    try:
        first = asyncio.ensure_future(lane.call(blocking))
        second = asyncio.ensure_future(lane.call(ran.append, "second"))
        third = asyncio.ensure_future(lane.call(ran.append, "third"))
        await asyncio.sleep(0.01)  # the first is running, the others wait behind it
        second.cancel()
        release.set()
        await first
        await third
        with pytest.raises(asyncio.CancelledError):
            await second
    finally:
        await lane.close()
    assert ran == ["first", "third"]


@pytest.mark.anyio
async def test_a_call_whose_caller_left_while_it_ran_ends_and_the_lane_goes_on(
    ledger: Ledger,
) -> None:
    started = threading.Event()
    release = threading.Event()
    ran: list[str] = []

    def slow() -> str:
        started.set()
        release.wait(5)
        ran.append("slow")
        return "slow"

    async def main() -> str:
        lane = ThreadLane(ledger, "test-lane")
        try:
            waiting = asyncio.ensure_future(lane.call(slow))
            while not started.is_set():
                await asyncio.sleep(0.001)
            waiting.cancel()
            release.set()
            return await lane.call(lambda: "next")
        finally:
            await lane.close()

    assert await main() == "next"
    assert ran == ["slow"]


@pytest.mark.anyio
async def test_closing_finishes_what_was_sent_and_refuses_what_comes_after(ledger: Ledger) -> None:
    ran: list[int] = []

    lane = ThreadLane(ledger, "test-lane")
    sent = [asyncio.ensure_future(lane.call(ran.append, index)) for index in range(5)]
    await asyncio.sleep(0)  # every call is queued before the lane closes
    await lane.close()
    await asyncio.gather(*sent)
    with pytest.raises(RuntimeError, match="'test-lane' is closed"):
        await lane.call(ran.append, 99)
    assert ran == [0, 1, 2, 3, 4]
