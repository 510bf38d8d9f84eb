"""A dispatched request's two deadlines, on one timer per stream: the stall deadline counts from
the last chunk, not from the start; the total cap ends a long stream served with what it has."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import numpy as np
import pytest

from inference_auctions.server.dispatch import Serving, _Stalled, _Streamed
from inference_auctions.server.engine.base import EngineChunk
from inference_auctions.server.metrics import Metrics
from inference_auctions.server.settings import ServerSettings
from inference_auctions.server.tickets import Ticket


class _Engine:
    """A generation that sends a chunk every `every` seconds (after `first`), `count` in all,
    the last one finished; or stops sending after `count` if `hang`."""

    def __init__(
        self, every: float, count: int, first: float | None = None, hang: bool = False
    ) -> None:
        self.every, self.count, self.first, self.hang = every, count, first, hang
        self.cancelled: list[str] = []

    async def chunks(self) -> AsyncIterator[EngineChunk]:
        for i in range(1, self.count + 1):
            await asyncio.sleep(self.every if i > 1 or self.first is None else self.first)
            finished = i == self.count and not self.hang
            meta = {"finish_reason": {"type": "length"} if finished else None}
            yield EngineChunk("r", "x" * i, [7] * i, meta)
        if self.hang:
            await asyncio.sleep(3600)

    def cancel(self, reason: str) -> None:
        self.cancelled.append(reason)


def _stream(engine: _Engine, stall: float, cap: float | None = None) -> _Streamed:
    settings = ServerSettings(engine_stall_timeout_seconds=stall, engine_max_seconds=cap)
    metrics = Metrics(queue_length=lambda: 0, inflight=lambda: 0)
    serving = Serving(settings, None, None, metrics, lambda _: None)  # type: ignore[arg-type]
    ticket = Ticket("ann", "r", "ann/r", np.zeros(2, dtype=np.int32), 1, {}, "f")

    async def run() -> _Streamed:
        ticket.dispatched = time.monotonic()
        return await serving._stream(ticket, engine)  # type: ignore[arg-type]

    return asyncio.run(run())


def test_a_stream_longer_than_the_stall_deadline_is_not_a_stall() -> None:
    # 12 chunks 0.05 s apart: 0.6 s in all, four times the stall deadline of 0.15 s.
    streamed = _stream(_Engine(every=0.05, count=12), stall=0.15)
    assert streamed.final is not None and streamed.final.text == "x" * 12
    assert streamed.ttft is not None


def test_no_chunk_within_the_stall_deadline_is_a_stall() -> None:
    started = time.monotonic()
    with pytest.raises(_Stalled):
        _stream(_Engine(every=0.02, count=3, first=1.0), stall=0.1)
    assert time.monotonic() - started < 0.5


def test_a_stall_after_some_chunks_counts_from_the_last_one() -> None:
    engine = _Engine(every=0.05, count=6, hang=True)
    started = time.monotonic()
    with pytest.raises(_Stalled):
        _stream(engine, stall=0.2)
    # Six chunks (0.3 s), then 0.2 s without one; the total cap is not set.
    assert 0.45 < time.monotonic() - started < 1.5
    assert engine.cancelled == []


def test_the_total_cap_ends_a_steady_stream_served_with_its_output_so_far() -> None:
    engine = _Engine(every=0.03, count=1000)
    started = time.monotonic()
    streamed = _stream(engine, stall=1.0, cap=0.3)
    assert 0.25 < time.monotonic() - started < 1.0
    assert streamed.final is not None and streamed.streamed
    assert streamed.final.meta_info["finish_reason"]["type"] == "abort"
    assert engine.cancelled == ["the operator's total-time cap passed"]


def test_the_total_cap_before_any_chunk_is_a_stall() -> None:
    with pytest.raises(_Stalled):
        _stream(_Engine(every=0.02, count=3, first=1.0), stall=5.0, cap=0.1)
