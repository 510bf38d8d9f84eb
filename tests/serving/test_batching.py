"""The pool's policy: work-conserving batches, held back only while the engine is saturated."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from inference_auctions.server.serving.pool import BatchingPolicy, BatchPool, PoolClosed
from inference_auctions.server.settings import ServerSettings

# Long enough that a batch the policy should hold back would have closed by then.
_SETTLE = 0.15


class _Engine:
    """What the pool asks: how many requests are outstanding, whether it is saturated."""

    def __init__(self) -> None:
        self.inflight = 0
        self.saturated = False


def _pool(
    engine: _Engine, batches: list[list[int]], *, max_wait: float | None = None, size: int = 64
) -> BatchPool[int, None]:
    if max_wait is None:  # the server's default window
        max_wait = ServerSettings().max_wait_ms / 1000
    policy = BatchingPolicy(batch_size=size, max_wait=max_wait, max_inflight=4, max_queue=100)

    async def clear(items: list[int], _context: None) -> None:
        batches.append(items)

    # The loop's clock: the collection window runs on the same (virtual) time as the timers.
    clock = asyncio.get_running_loop().time
    return BatchPool(policy, clear, lambda: engine.inflight, lambda: engine.saturated, clock=clock)


async def _run(
    test: Callable[[BatchPool[int, None], _Engine, list[list[int]]], Awaitable[None]],
) -> None:
    engine, batches = _Engine(), []
    pool = _pool(engine, batches)
    runner = asyncio.create_task(pool.run())
    try:
        await test(pool, engine, batches)
    finally:
        runner.cancel()


async def _until(condition: Callable[[], bool], timeout: float = 2.0) -> float:
    """Seconds (of the loop's clock) until `condition` holds; fails after `timeout`."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    while not condition():
        assert loop.time() - start < timeout, "the pool never closed the batch"
        await asyncio.sleep(0.001)
    return loop.time() - start


@pytest.mark.anyio
@pytest.mark.virtual_time
async def test_a_lone_request_goes_straight_through() -> None:
    async def test(pool: BatchPool[int, None], engine: _Engine, batches: list[list[int]]) -> None:
        pool.submit(1)
        waited = await _until(lambda: bool(batches))
        assert batches == [[1]]
        assert waited < 0.02  # no collection window by default

    await _run(test)


@pytest.mark.anyio
@pytest.mark.virtual_time
async def test_a_saturated_engine_holds_requests_and_the_next_batch_takes_the_backlog() -> None:
    async def test(pool: BatchPool[int, None], engine: _Engine, batches: list[list[int]]) -> None:
        engine.saturated = True
        for item in range(5):
            pool.submit(item)
        await asyncio.sleep(_SETTLE)
        assert batches == []
        assert len(pool) == 5
        engine.saturated = False
        pool.wake()  # a request started at the engine
        await _until(lambda: bool(batches))
        # One auction over the backlog, as far as `max_inflight` (4) leaves room: this fake
        # engine's count never grows, so the one left over goes next.
        assert batches[0] == [0, 1, 2, 3]

    await _run(test)


@pytest.mark.anyio
@pytest.mark.virtual_time
async def test_the_pool_waits_for_a_wake_up_not_a_timer() -> None:
    async def test(pool: BatchPool[int, None], engine: _Engine, batches: list[list[int]]) -> None:
        engine.saturated = True
        pool.submit(1)
        await asyncio.sleep(0.01)
        engine.saturated = False  # unnoticed until someone says the engine's load changed
        await asyncio.sleep(_SETTLE)
        assert batches == []
        pool.wake()
        await _until(lambda: bool(batches))
        assert batches == [[1]]

    await _run(test)


@pytest.mark.anyio
@pytest.mark.virtual_time
async def test_max_inflight_still_caps() -> None:
    async def test(pool: BatchPool[int, None], engine: _Engine, batches: list[list[int]]) -> None:
        engine.inflight = 4  # at the cap, though not saturated
        pool.submit(1)
        pool.submit(2)
        await asyncio.sleep(_SETTLE)
        assert batches == []
        engine.inflight = 3
        pool.wake()  # a request left the engine
        await _until(lambda: bool(batches))
        assert batches[0] == [1]  # a hard cap: one request's room left, one request taken

    await _run(test)


@pytest.mark.anyio
@pytest.mark.virtual_time
async def test_a_batch_takes_at_most_batch_size() -> None:
    engine, batches = _Engine(), []
    pool = _pool(engine, batches, size=2)
    engine.saturated = True
    for item in range(5):
        pool.submit(item)
    runner = asyncio.create_task(pool.run())
    await asyncio.sleep(0.01)
    engine.saturated = False
    pool.wake()
    await _until(lambda: len(batches) == 3)
    runner.cancel()
    assert batches == [[0, 1], [2, 3], [4]]


@pytest.mark.anyio
@pytest.mark.virtual_time
async def test_the_collection_window_collects_while_the_engine_is_free() -> None:
    engine, batches = _Engine(), []
    pool = _pool(engine, batches, max_wait=0.1)
    runner = asyncio.create_task(pool.run())
    pool.submit(1)
    await asyncio.sleep(0.02)
    pool.submit(2)
    waited = await _until(lambda: bool(batches))
    runner.cancel()
    assert batches == [[1, 2]]
    assert waited >= 0.05


@pytest.mark.anyio
@pytest.mark.virtual_time
async def test_drain_clears_the_backlog_once_the_engine_takes_it() -> None:
    async def test(pool: BatchPool[int, None], engine: _Engine, batches: list[list[int]]) -> None:
        engine.saturated = True
        pool.submit(1)
        drained = asyncio.create_task(pool.drain())
        await asyncio.sleep(0.02)
        with pytest.raises(PoolClosed):
            pool.submit(2)
        assert not drained.done()
        engine.saturated = False
        pool.wake()
        await asyncio.wait_for(drained, 2)
        assert batches == [[1]]

    await _run(test)


@pytest.mark.anyio
@pytest.mark.virtual_time
async def test_a_withdrawn_request_leaves_the_backlog() -> None:
    async def test(pool: BatchPool[int, None], engine: _Engine, batches: list[list[int]]) -> None:
        engine.saturated = True
        pool.submit(1)
        pool.submit(2)
        assert pool.withdraw(1)
        engine.saturated = False
        pool.wake()
        await _until(lambda: bool(batches))
        assert batches == [[2]]
        assert not pool.withdraw(2)

    await _run(test)


@pytest.mark.anyio
@pytest.mark.virtual_time
async def test_a_pool_drained_and_cancelled_during_a_collection_window_stops() -> None:
    """A request withdrawn inside its window leaves the pool waiting on a timer; the drain's
    wake-up and the cancel then land in one turn of the loop, and the pool must still stop
    (`asyncio.wait_for` on Python 3.11 returned the finished wait and dropped the cancel)."""

    engine, batches = _Engine(), []
    pool = _pool(engine, batches, max_wait=5.0)
    runner = asyncio.create_task(pool.run())
    pool.submit(1)
    await asyncio.sleep(0.01)  # the pool now waits out the window of request 1
    assert pool.withdraw(1)  # refused: say its hold was
    await pool.drain()
    runner.cancel()
    done, _ = await asyncio.wait({runner}, timeout=1.0)
    assert done == {runner} and runner.cancelled()
    assert batches == []
