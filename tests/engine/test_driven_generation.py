"""A generation driven by its consumer (`Driver`): the producer runs on the driver's one task,
chunks reach the driver as they are produced, and the driver always gets its task, whether the
generation ends, fails, is cancelled or never starts."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable

import pytest

from inference_auctions.server.engine.errors import (
    EngineError,
    EngineProtocolError,
    EngineUnavailable,
)
from inference_auctions.server.engine.protocol import (
    EngineChunk,
    EngineRequest,
    EngineResult,
    Generation,
)


class _Recorder:
    """A driver that notes the chunks, the task they came on, and what followed the end."""

    context = None

    def __init__(self) -> None:
        self.chunks: list[str] = []
        self.chunk_tasks: set[asyncio.Task[object] | None] = set()
        self.drive_task: asyncio.Task[object] | None = None
        self.after: list[str] = []  # what the driver did once the producer ended
        self.ended = asyncio.get_running_loop().create_future()

    def chunk(self, chunk: EngineChunk) -> None:
        self.chunks.append(chunk.text)
        self.chunk_tasks.add(asyncio.current_task())

    async def drive(self, generation: Generation, produce: Awaitable[None]) -> None:
        self.drive_task = asyncio.current_task()
        try:
            await produce
            await asyncio.sleep(0)  # the follow-up may await (a ledger commit)
            error = generation.error
            self.after.append("error: " + error.message if error is not None else "done")
        finally:
            self.ended.set_result(None)


def _chunk(text: str, finished: bool = False) -> EngineChunk:
    meta = {"finish_reason": {"type": "stop"} if finished else None}
    return EngineChunk("r", text, [1] * len(text), meta)


async def _steady(generation: Generation, count: int, every: float = 0.0) -> None:
    for i in range(1, count + 1):
        await asyncio.sleep(every)
        chunk = _chunk("x" * i, finished=i == count)
        generation.emit(chunk)
    generation.finish(EngineResult.from_chunk(chunk))


@pytest.mark.anyio
async def test_chunks_reach_the_driver_on_its_own_task_and_it_goes_on_after_the_end() -> None:
    driver = _Recorder()
    generation = Generation(EngineRequest("r", [1]), driver)
    before = asyncio.all_tasks()
    generation.start(_steady(generation, 3))
    assert len(asyncio.all_tasks() - before) == 1  # one task: the driver's
    await asyncio.wait_for(driver.ended, 1)
    assert driver.chunks == ["x", "xx", "xxx"]
    assert driver.chunk_tasks == {driver.drive_task}
    assert driver.after == ["done"]
    assert (await generation.result()).text == "xxx"


@pytest.mark.anyio
async def test_a_producer_that_raises_ends_the_generation_and_the_driver_goes_on() -> None:
    async def broken(generation: Generation) -> None:
        generation.emit(_chunk("x"))
        raise EngineProtocolError("the stream broke")

    driver = _Recorder()
    generation = Generation(EngineRequest("r", [1]), driver)
    generation.start(broken(generation))
    await asyncio.wait_for(driver.ended, 1)
    assert driver.after == ["error: the stream broke"]
    with pytest.raises(EngineProtocolError):
        await generation.result()


@pytest.mark.anyio
async def test_a_producer_that_returns_without_a_result_fails_the_generation() -> None:
    async def silent(generation: Generation) -> None:
        generation.emit(_chunk("x"))

    driver = _Recorder()
    generation = Generation(EngineRequest("r", [1]), driver)
    generation.start(silent(generation))
    await asyncio.wait_for(driver.ended, 1)
    assert driver.after == ["error: the engine ended the request without a result"]


@pytest.mark.anyio
async def test_cancel_stops_the_producer_but_not_the_driver() -> None:
    stopped: list[bool] = []

    async def endless(generation: Generation) -> None:
        try:
            await _steady(generation, 1_000_000, every=0.01)
        except asyncio.CancelledError:
            stopped.append(True)  # an engine aborts the request here
            raise

    driver = _Recorder()
    generation = Generation(EngineRequest("r", [1]), driver)
    generation.start(endless(generation))
    await asyncio.sleep(0.05)
    generation.cancel("the client disconnected")
    await asyncio.wait_for(driver.ended, 1)
    assert stopped == [True]
    assert driver.after == ["error: the client disconnected"]  # the driver ran on, uncancelled
    assert driver.drive_task is not None and driver.drive_task.cancelling() == 0
    assert isinstance(generation.error, EngineUnavailable)


@pytest.mark.anyio
async def test_a_cancellation_from_outside_reaches_the_driver() -> None:
    """A deadline's timeout scope cancels the driver's task: that is the driver's to handle,
    and the generation counts as cancelled."""

    class _Timed(_Recorder):
        async def drive(self, generation: Generation, produce: Awaitable[None]) -> None:
            try:
                async with asyncio.timeout(0.05):
                    await produce
            except TimeoutError:
                self.after.append("timed out")
            self.ended.set_result(None)

    driver = _Timed()
    generation = Generation(EngineRequest("r", [1]), driver)
    generation.start(_steady(generation, 1_000_000, every=0.01))
    await asyncio.wait_for(driver.ended, 1)
    assert driver.after == ["timed out"]
    assert isinstance(generation.error, EngineUnavailable)


@pytest.mark.anyio
async def test_a_generation_that_ends_before_it_starts_still_gets_its_driver() -> None:
    driver = _Recorder()
    generation = Generation(EngineRequest("r", [1]), driver)
    generation.fail(EngineError("refused at the door"))  # never started: no producer
    await asyncio.wait_for(driver.ended, 1)
    assert driver.after == ["error: refused at the door"]


@pytest.mark.anyio
async def test_a_generation_cancelled_before_its_task_first_ran_runs_no_producer() -> None:
    ran: list[bool] = []

    async def producer(generation: Generation) -> None:
        ran.append(True)

    driver = _Recorder()
    generation = Generation(EngineRequest("r", [1]), driver)
    generation.start(producer(generation))
    generation.cancel("its batch is cleared again")  # before the task's first step
    await asyncio.wait_for(driver.ended, 1)
    assert ran == []
    assert driver.after == ["error: its batch is cleared again"]
