"""The embedded engine: the emulator in process, behind the same protocol as SGLang's."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest

from inference_auctions.server.emulator import EmbeddedEngine
from inference_auctions.server.emulator.live import LiveSimulator
from inference_auctions.server.emulator.simulator import EngineSimulator, Step
from inference_auctions.server.engine import SGLangHTTPEngine
from inference_auctions.server.engine.builtin_tokenizer import encode
from inference_auctions.server.engine.errors import (
    EngineRejected,
    EngineServerError,
    EngineUnavailable,
)
from inference_auctions.server.engine.protocol import EngineRequest, EngineResult
from inference_auctions.server.engine_choice import make_engine


@asynccontextmanager
async def _engine(**simulator: Any) -> AsyncIterator[EmbeddedEngine]:
    engine = EmbeddedEngine(LiveSimulator(EngineSimulator(**simulator), time_scale=0.01))
    await engine.start()
    try:
        yield engine
    finally:
        await engine.close()


def _request(rid: str, prompt: list[int], max_new: int = 2, **more: Any) -> EngineRequest:
    return EngineRequest(rid, prompt, {"max_new_tokens": max_new}, **more)


@pytest.mark.anyio
async def test_a_batch_is_served_in_priority_order_with_cache_reuse() -> None:
    article = encode("An article about radix trees and auctions. " * 40)

    async def run() -> list[EngineResult]:
        # A one-token prefill budget: one request per prefill step, so first tokens are apart.
        async with _engine(chunked_prefill_size=1) as engine:
            questions = [encode(f" Question {k}?") for k in range(6)]
            batch = [
                _request(f"q{p}", article + q, priority=p)
                for p, q in zip([4, 2, 5, 0, 3, 1], questions, strict=True)
            ]
            generations = engine.dispatch(batch)
            return [await g.result() for g in generations]

    results = await run()
    by_first_token = sorted(results, key=lambda r: r.meta_info["prefill_finished_time"])
    assert [r.rid for r in by_first_token] == [f"q{p}" for p in range(6)]
    shared = len(article) + 1  # the article and " Question"
    assert [r.usage.cached_tokens for r in by_first_token] == [0] + [shared] * 5
    assert all(r.usage.prompt_tokens == len(article) + len(encode(" Question 0?")) for r in results)


@pytest.mark.anyio
async def test_generate_and_stream_agree() -> None:
    async def run() -> tuple[EngineResult, list[Any]]:
        async with _engine() as engine:
            result = await engine.generate(_request("a", [1, 2, 3], 5))
            chunks = [c async for c in engine.stream(_request("b", [1, 2, 3], 5, stream=True))]
            return result, chunks

    result, chunks = await run()
    assert [c.meta_info["completion_tokens"] for c in chunks] == [1, 2, 3, 4, 5]
    assert chunks[-1].text == result.text
    assert result.usage.cached_tokens == 0
    assert chunks[-1].meta_info["cached_tokens"] == 2  # the same prompt, all but its last token
    assert result.ttft is not None and result.e2e_latency is not None


@pytest.mark.anyio
async def test_bad_requests_are_rejected_per_generation() -> None:
    async def run() -> tuple[BaseException | EngineResult, ...]:
        async with _engine(cache_tokens=100) as engine:
            generations = engine.dispatch(
                [
                    EngineRequest("x", [1], {"temperatur": 1.0}),
                    _request("long", list(range(1, 200))),
                    _request("fine", [1, 2]),
                ]
            )
            return tuple(
                await asyncio.gather(*(g.result() for g in generations), return_exceptions=True)
            )

    unknown, too_long, fine = await run()
    assert isinstance(unknown, EngineRejected) and "unknown field" in unknown.message
    assert isinstance(too_long, EngineRejected) and "context length" in too_long.message
    assert isinstance(fine, EngineResult)


@pytest.mark.anyio
async def test_close_fails_what_is_still_running() -> None:
    engine = EmbeddedEngine(time_scale=1.0)
    await engine.start()
    assert await engine.health()
    (generation,) = engine.dispatch([_request("slow", [1, 2, 3], 1000)])
    await generation.admitted()
    await engine.close()
    assert not await engine.health()
    (outcome,) = await asyncio.gather(generation.result(), return_exceptions=True)
    assert isinstance(outcome, EngineUnavailable)


@pytest.mark.anyio
async def test_a_cancelled_generation_frees_the_engine() -> None:
    async with _engine() as engine:
        (generation,) = engine.dispatch([_request("gone", [1, 2, 3], 10_000)])
        await generation.admitted()
        generation.cancel()
        with pytest.raises(EngineUnavailable):
            await generation.result()
        async with asyncio.timeout(5):  # a request in its prefill step leaves at its end
            while engine.live.simulator.num_running:
                await asyncio.sleep(0.001)


def test_make_engine_picks_by_url() -> None:
    assert isinstance(make_engine(None), EmbeddedEngine)
    sglang = make_engine("http://127.0.0.1:30000", mode="ordered", timeout=5.0)
    assert isinstance(sglang, SGLangHTTPEngine)
    assert (sglang.mode, sglang.request_timeout) == ("ordered", 5.0)
    with pytest.raises(ValueError, match="mode"):
        make_engine(None, mode="fastest")


class _FailingSimulator(EngineSimulator):
    """A simulator whose clock breaks on demand."""

    broken = False

    def advance_to(self, time: float) -> list[Step]:
        if self.broken:
            raise RuntimeError("the clock broke")
        return super().advance_to(time)


@pytest.mark.anyio
async def test_a_driver_failure_fails_what_is_in_flight() -> None:
    async def run() -> BaseException | EngineResult:
        simulator = _FailingSimulator()
        engine = EmbeddedEngine(LiveSimulator(simulator, time_scale=0.01))
        await engine.start()
        try:
            (generation,) = engine.dispatch([_request("doomed", [1, 2, 3], 1000)])
            simulator.broken = True
            (outcome,) = await asyncio.gather(generation.result(), return_exceptions=True)
            assert not await engine.health()
            return outcome
        finally:
            await engine.close()

    outcome = await run()
    assert isinstance(outcome, EngineServerError)
    assert outcome.engine_status == 500


@pytest.mark.anyio
async def test_long_and_short_texts_tokenize_alike() -> None:
    # A long text is tokenized on a worker thread; the ids must not depend on where.
    engine = EmbeddedEngine(time_scale=0.001)
    long_text = "The quick brown fox jumps over the lazy dog. " * 2_000
    assert await engine.tokenize(long_text) == encode(long_text)
    assert await engine.tokenize("short text") == encode("short text")
