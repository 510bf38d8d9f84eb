"""A dispatched request's two deadlines, on one timer for every stream of the server: the stall
deadline counts from the last chunk, not from the start; the total cap ends a long stream
served with what it has; one stream's deadline never touches another's."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable

import numpy as np
import pytest

from inference_auctions.server.engine.protocol import (
    EngineChunk,
    EngineRequest,
    EngineResult,
    Generation,
)
from inference_auctions.server.metrics import Metrics
from inference_auctions.server.serving.following import (
    FollowedRequest,
    Follower,
    _Stalled,
    _Streamed,
)
from inference_auctions.server.serving.tickets import Ticket
from inference_auctions.server.settings import ServerSettings


class _Engine:
    """A producer that emits a chunk every `every` seconds (after `first`), `count` in all,
    the last one finished; or stops sending after `count` if `hang`."""

    def __init__(
        self, every: float, count: int, first: float | None = None, hang: bool = False
    ) -> None:
        self.every, self.count, self.first, self.hang = every, count, first, hang
        self.cancelled: list[str] = []

    async def produce(self, generation: Generation) -> None:
        for i in range(1, self.count + 1):
            await asyncio.sleep(self.every if i > 1 or self.first is None else self.first)
            finished = i == self.count and not self.hang
            meta = {"finish_reason": {"type": "length"} if finished else None}
            chunk = EngineChunk("r", "x" * i, [7] * i, meta)
            generation.emit(chunk)
            if finished:
                generation.finish(EngineResult.from_chunk(chunk))
        if self.hang:
            await asyncio.sleep(3600)


class _Unwatched:
    """Counts nothing: these tests watch the deadlines, not the engine's load."""

    def started(self, engine_rid: str) -> None:
        pass

    def freed(self, engine_rid: str) -> None:
        pass


def _serving(stall: float, cap: float | None = None) -> Follower:
    settings = ServerSettings(engine_stall_timeout_seconds=stall, engine_max_seconds=cap)
    metrics = Metrics(queue_length=lambda: 0, inflight=lambda: 0)
    return Follower(settings, None, None, metrics, load=_Unwatched())  # type: ignore[arg-type]


class _StreamOnly:
    """Drives a generation as the server's follower does, up to the end of its stream: its
    chunks to the follower, the producer under the follower's deadlines; what came of it."""

    def __init__(self, followed: FollowedRequest, engine: _Engine) -> None:
        self.followed = followed
        self.engine = engine
        self.context = None
        self.outcome: asyncio.Future[_Streamed] = asyncio.get_running_loop().create_future()

    def chunk(self, chunk: EngineChunk) -> None:
        self.followed.chunk(chunk)

    async def drive(self, generation: Generation, produce: Awaitable[None]) -> None:
        try:
            self.outcome.set_result(await self.followed.stream(generation, produce))
        except _Stalled as stalled:
            self.outcome.set_exception(stalled)


class _Recorded(Generation):
    """A generation that notes why the follower cancelled it."""

    def __init__(self, request: EngineRequest, driver: _StreamOnly) -> None:
        super().__init__(request, driver)
        self.reasons = driver.engine.cancelled

    def cancel(self, reason: str = "the generation was cancelled") -> None:
        self.reasons.append(reason)
        super().cancel(reason)


async def _follow(serving: Follower, engine: _Engine, rid: str = "r") -> _Streamed:
    ticket = Ticket("ann", rid, f"ann/{rid}", np.zeros(2, dtype=np.int32), 1, {}, "f")
    ticket.dispatched = time.monotonic()
    driver = _StreamOnly(serving.follow(ticket, None), engine)  # type: ignore[arg-type]
    generation = _Recorded(EngineRequest(rid, [1, 2]), driver)
    generation.start(engine.produce(generation))
    return await driver.outcome


async def _stream(engine: _Engine, stall: float, cap: float | None = None) -> _Streamed:
    return await _follow(_serving(stall, cap), engine)


def _now() -> float:
    return asyncio.get_running_loop().time()


@pytest.mark.anyio
@pytest.mark.virtual_time
async def test_a_stream_longer_than_the_stall_deadline_is_not_a_stall() -> None:
    # 12 chunks 0.05 s apart: 0.6 s in all, four times the stall deadline of 0.15 s.
    streamed = await _stream(_Engine(every=0.05, count=12), stall=0.15)
    assert streamed.final is not None and streamed.final.text == "x" * 12
    assert streamed.ttft is not None


@pytest.mark.anyio
@pytest.mark.virtual_time
async def test_no_chunk_within_the_stall_deadline_is_a_stall() -> None:
    started = _now()
    with pytest.raises(_Stalled):
        await _stream(_Engine(every=0.02, count=3, first=1.0), stall=0.1)
    assert _now() - started == pytest.approx(0.1)


@pytest.mark.anyio
@pytest.mark.virtual_time
async def test_a_stall_after_some_chunks_counts_from_the_last_one() -> None:
    engine = _Engine(every=0.05, count=6, hang=True)
    started = _now()
    with pytest.raises(_Stalled):
        await _stream(engine, stall=0.2)
    # Six chunks (0.3 s), then 0.2 s without one; the total cap is not set.
    assert _now() - started == pytest.approx(0.5)
    assert engine.cancelled == []


@pytest.mark.anyio
@pytest.mark.virtual_time
async def test_the_total_cap_ends_a_steady_stream_served_with_its_output_so_far() -> None:
    engine = _Engine(every=0.03, count=1000)
    started = _now()
    streamed = await _stream(engine, stall=1.0, cap=0.3)
    assert _now() - started == pytest.approx(0.3)
    assert streamed.final is not None and streamed.streamed
    assert streamed.final.meta_info["finish_reason"]["type"] == "abort"
    assert engine.cancelled == ["the operator's total-time cap passed"]


@pytest.mark.anyio
@pytest.mark.virtual_time
async def test_the_total_cap_before_any_chunk_is_a_stall() -> None:
    with pytest.raises(_Stalled):
        await _stream(_Engine(every=0.02, count=3, first=1.0), stall=5.0, cap=0.1)


@pytest.mark.anyio
@pytest.mark.virtual_time
async def test_many_streams_share_the_deadlines_and_only_the_stalled_one_fails() -> None:
    # Five steady streams (a chunk every 0.03 s, 0.45 s in all) and one that stalls after two
    # chunks, all on one server with a 0.15 s stall deadline; then a second wave, so the one
    # timer is armed again after it has run dry.
    serving = _serving(stall=0.15)

    async def wave() -> tuple[list[_Streamed | BaseException], float]:
        started = _now()
        stalled_at: list[float] = []

        async def stalling() -> _Streamed:
            try:
                return await _follow(serving, _Engine(every=0.03, count=2, hang=True), "stall")
            finally:
                stalled_at.append(_now() - started)

        steady = [_follow(serving, _Engine(every=0.03, count=15), f"s{i}") for i in range(5)]
        results = await asyncio.gather(stalling(), *steady, return_exceptions=True)
        return list(results), stalled_at[0]

    for _ in range(2):
        # Bounded: a timer that never fired again would leave the stalled stream hanging.
        results, stalled_after = await asyncio.wait_for(wave(), timeout=5)
        assert isinstance(results[0], _Stalled)
        # Two chunks (0.06 s), then 0.15 s without one.
        assert stalled_after == pytest.approx(0.21)
        for streamed in results[1:]:
            assert isinstance(streamed, _Streamed)
            assert streamed.final is not None and streamed.final.text == "x" * 15
        assert len(serving._deadlines) == 0  # every stream let go of its deadlines


@pytest.mark.anyio
@pytest.mark.virtual_time
async def test_a_capped_stream_and_a_stalled_one_are_told_apart_on_one_timer() -> None:
    serving = _serving(stall=0.2, cap=0.3)

    steady, silent = list(
        await asyncio.gather(
            _follow(serving, _Engine(every=0.03, count=1000), "steady"),
            _follow(serving, _Engine(every=0.03, count=1, first=1.0), "silent"),
            return_exceptions=True,
        )
    )
    assert isinstance(steady, _Streamed) and steady.final is not None
    assert steady.final.meta_info["finish_reason"]["type"] == "abort"  # capped, served
    assert isinstance(silent, _Stalled)  # nothing within the stall deadline
