"""The SGLang backend over real HTTP, against the emulator served by uvicorn."""

from __future__ import annotations

import asyncio
import random
from itertools import pairwise
from typing import Any

import httpx
import numpy as np
import pytest

from inference_auctions.server.engine.builtin_tokenizer import encode
from inference_auctions.server.engine.errors import EngineRejected
from inference_auctions.server.engine.protocol import EngineRequest, EngineResult
from inference_auctions.server.engine.sglang_http import SGLangHTTPEngine
from tests.engine.conftest import emulator, started_engine


def _request(
    rid: str, seed: int, *, tokens: int = 200, max_new: int = 2, priority: int = 0, **more: Any
) -> EngineRequest:
    rng = random.Random(seed)
    prompt = [rng.randrange(1, 1 << 20) for _ in range(tokens)]
    params = {"max_new_tokens": max_new, **more.pop("params", {})}
    return EngineRequest(rid, prompt, params, priority, **more)


def _first_token_order(results: list[EngineResult]) -> list[str]:
    return [r.rid for r in sorted(results, key=lambda r: r.meta_info["prefill_finished_time"])]


@pytest.mark.anyio
async def test_priority_mode_serves_a_batch_in_priority_order() -> None:
    priorities = [7, 3, 9, 1, 5, 2]

    async def run(url: str) -> list[EngineResult]:
        async with started_engine(url) as engine:
            # One request at a time: the rest queue behind the long first one and are then
            # admitted strictly by priority, whatever order they arrived in. The blocker runs
            # long enough (2 s of wall time) for all of them to arrive on a busy machine.
            blocker = _request("blocker", 0, max_new=1600, priority=0)  # 40 s model, 2 s wall
            batch = [_request(f"r{p}", p, priority=p) for p in priorities]
            generations = engine.dispatch([blocker, *batch])
            return [await generation.result() for generation in generations]

    with emulator(time_scale=0.05, max_running_requests=1) as (url, _):
        results = await run(url)
    expected = ["blocker"] + [f"r{p}" for p in sorted(priorities)]
    assert _first_token_order(results) == expected
    assert all(r.meta_info["queue_time"] > 0 for r in results[1:])  # they did wait


@pytest.mark.anyio
async def test_priority_mode_admits_a_request_once_it_is_sent() -> None:
    async def run(url: str) -> None:
        async with started_engine(url) as engine:
            (generation,) = engine.dispatch([_request("long", 1, max_new=5000)])
            await asyncio.wait_for(generation.admitted(), timeout=5)
            assert not generation.done()  # admitted on sending, long before its end
            generation.cancel()

    with emulator() as (url, _):
        await run(url)


async def _turns(count: int) -> None:
    """Let the event loop run `count` turns."""
    for _ in range(count):
        await asyncio.sleep(0)


async def _loads(url: str) -> dict[str, Any]:
    async with httpx.AsyncClient(base_url=url, timeout=10) as client:
        reply = await client.get("/v1/loads")
        loads: dict[str, Any] = reply.json()["loads"][0]
        return loads


@pytest.mark.anyio
async def test_a_streamed_batch_goes_out_in_one_turn_of_the_loop_when_connections_are_idle() -> (
    None
):
    count = 6

    async def run(url: str) -> None:
        async with started_engine(url) as engine:
            # Warm the pool: `count` streams running at once leave `count` idle connections.
            # The emulator holds them until all have arrived, so that none ends before the
            # last one has its own connection (on a busy machine one could, and leave its
            # connection to the next).
            warm = engine.dispatch(
                [_request(f"w{i}", i, max_new=200, stream=True) for i in range(count)]
            )
            for generation in warm:
                await generation.result()
            assert engine._client is not None and engine._client.idle_connections == count
            batch = engine.dispatch(
                [_request(f"b{i}", 100 + i, priority=i, stream=True) for i in range(count)]
            )
            # The sender wakes on the next turn and writes the whole batch then, in order,
            # before any reading task runs; one request per turn would have sent one.
            await _turns(2)
            assert [g.rid for g in batch if g.is_admitted] == [g.rid for g in batch]
            results = [await generation.result() for generation in batch]
            assert all(r.usage.completion_tokens == 2 for r in results)

    with emulator(together=count) as (url, _):
        await run(url)


@pytest.mark.anyio
async def test_a_request_written_ahead_whose_reader_never_ran_is_aborted() -> None:
    async def run(url: str) -> None:
        async with started_engine(url) as engine:
            (warm,) = engine.dispatch([_request("warm", 1, stream=True)])
            await warm.result()
            (generation,) = engine.dispatch([_request("long", 2, max_new=5000, stream=True)])
            # One turn: the sender, woken first, writes the request and schedules the reading
            # task, which runs after this coroutine resumes.
            await _turns(1)
            assert generation.is_admitted  # written by the sender
            generation.cancel()  # before its reading task ever ran
            assert engine._client is not None
            for _ in range(200):  # the connection closes, and the emulator aborts the request
                loads = await _loads(url)
                if engine._client.open_connections == 0 and loads["num_running_reqs"] == 0:
                    break
                await asyncio.sleep(0.01)
            assert engine._client.open_connections == 0
            assert loads["num_running_reqs"] == 0 and loads["num_waiting_reqs"] == 0

    with emulator() as (url, _):
        await run(url)


@pytest.mark.anyio
async def test_ordered_mode_sends_each_request_after_the_previous_one_started() -> None:
    async def run(url: str) -> list[EngineResult]:
        async with started_engine(url, mode="ordered") as engine:
            batch = [_request(f"r{p}", p, priority=p, max_new=3) for p in (7, 3, 9, 1)]
            generations = engine.dispatch(batch)
            return [await generation.result() for generation in generations]

    with emulator(time_scale=0.02, priority_scheduling=False) as (url, _):
        results = await run(url)
    assert _first_token_order(results) == ["r7", "r3", "r9", "r1"]
    for earlier, later in pairwise(results):
        received = later.meta_info["request_received_ts"]
        assert received >= earlier.meta_info["prefill_finished_time"]
    # Streamed internally, so the client measured a time to first token too.
    assert all(r.client_ttft is not None and r.client_ttft > 0 for r in results)
    assert all(r.usage.completion_tokens == 3 for r in results)


@pytest.mark.anyio
async def test_streaming_yields_cumulative_chunks_ending_with_the_result() -> None:
    async def run(url: str) -> tuple[list[Any], EngineResult]:
        async with started_engine(url) as engine:
            streamed = [c async for c in engine.stream(_request("s", 1, max_new=6, stream=True))]
            plain = await engine.generate(_request("p", 1, max_new=6))
            return streamed, plain

    with emulator() as (url, _):
        chunks, plain = await run(url)
    assert [c.meta_info["completion_tokens"] for c in chunks] == [1, 2, 3, 4, 5, 6]
    assert all(not c.finished for c in chunks[:-1]) and chunks[-1].finished
    assert all(later.text.startswith(earlier.text) for earlier, later in pairwise(chunks))
    assert chunks[-1].text == plain.text and chunks[-1].output_ids == plain.output_ids
    assert encode(plain.text) == plain.output_ids
    assert plain.finish_reason == {"type": "length", "length": 6}


@pytest.mark.anyio
async def test_results_report_usage_cache_hits_and_ttft() -> None:
    async def run(url: str) -> tuple[EngineResult, EngineResult]:
        async with started_engine(url) as engine:
            first = await engine.generate(_request("a", 5, tokens=300))
            again = await engine.generate(_request("b", 5, tokens=300))
            return first, again

    with emulator() as (url, _):
        first, again = await run(url)
    assert (first.usage.prompt_tokens, first.usage.cached_tokens) == (300, 0)
    assert again.usage.cached_tokens == 299
    assert first.usage.completion_tokens == 2
    assert first.ttft == pytest.approx(0.005 + 300 * 1e-4)  # meta_info, in model seconds
    assert again.ttft is not None and first.ttft is not None and again.ttft < first.ttft
    for key in ("queue_time", "e2e_latency", "request_received_ts", "request_finished_ts"):
        assert key in first.meta_info


def _tokenize_cache(engine: SGLangHTTPEngine) -> dict[str, int]:
    """Hits, misses and size of the engine's tokenize cache."""
    size = len(engine._tokens)  # the cache's bound is what is under test
    return {"hits": engine.tokenize_hits, "misses": engine.tokenize_misses, "size": size}


@pytest.mark.anyio
async def test_tokenize_is_cached_per_prompt_and_shared_between_concurrent_callers() -> None:
    async def run(url: str) -> list[list[int]]:
        async with started_engine(url) as engine:
            texts = ["Hello world", "Hello world", "An article. Question?"]
            concurrent = await asyncio.gather(*(engine.tokenize(t) for t in texts))
            again = await engine.tokenize("Hello world")
            assert _tokenize_cache(engine) == {"hits": 2, "misses": 2, "size": 2}
            return [*concurrent, again]

    with emulator() as (url, counts):
        tokens = await run(url)
        assert counts.paths["/tokenize"] == 2
    assert tokens[0] == tokens[1] == tokens[3] == encode("Hello world")
    assert tokens[2] == encode("An article. Question?")


@pytest.mark.anyio
async def test_a_caller_waiting_on_another_asks_again_when_the_first_gives_up() -> None:
    """The first caller of a text tokenizes it on its own task; if that caller is cancelled,
    one waiting for the same text is not cancelled with it but fetches the ids itself."""

    async def run(url: str) -> tuple[list[int], int]:
        async with started_engine(url) as engine:
            first = asyncio.ensure_future(engine.tokenize("Hello again"))
            await asyncio.sleep(0)  # the first caller is on its way to /tokenize
            second = asyncio.ensure_future(engine.tokenize("Hello again"))
            await asyncio.sleep(0)  # the second waits for the first's answer
            first.cancel()
            tokens = await second
            assert first.cancelled()
            return tokens, engine.tokenize_misses

    with emulator() as (url, _):
        tokens, misses = await run(url)
    assert tokens == encode("Hello again")
    assert misses == 2  # asked once by each: the first's answer never came


@pytest.mark.anyio
async def test_the_tokenize_cache_is_bounded() -> None:
    async def run(url: str) -> None:
        async with started_engine(url, tokenize_cache_size=2) as engine:
            for text in ("a", "b", "c", "a"):
                await engine.tokenize(text)
            assert _tokenize_cache(engine) == {"hits": 0, "misses": 4, "size": 2}

    with emulator() as (url, _):
        await run(url)


@pytest.mark.anyio
@pytest.mark.parametrize("stream", [False, True])
async def test_an_unknown_sampling_parameter_is_rejected(stream: bool) -> None:
    async def run(url: str) -> EngineRejected:
        async with started_engine(url) as engine:
            request = _request("x", 1, stream=stream, params={"temperatur": 0.5})
            with pytest.raises(EngineRejected) as caught:
                await engine.generate(request)
            return caught.value

    with emulator() as (url, _):
        error = await run(url)
    assert error.engine_status == 400
    assert error.http_status == 502
    assert "unknown field `temperatur`" in error.message


@pytest.mark.anyio
@pytest.mark.parametrize("stream", [False, True])
async def test_a_duplicate_rid_in_flight_is_rejected(stream: bool) -> None:
    async def run(url: str) -> EngineResult | BaseException:
        async with started_engine(url) as engine:
            (first,) = engine.dispatch([_request("same", 1, max_new=5000, stream=True)])
            async for _ in first.chunks():
                break  # the first is now running at the engine
            (duplicate,) = engine.dispatch([_request("same", 2, stream=stream)])
            (outcome,) = await asyncio.gather(duplicate.result(), return_exceptions=True)
            assert not first.done()
            first.cancel()
            return outcome

    with emulator() as (url, _):
        error = await run(url)
    assert isinstance(error, EngineRejected)
    assert "Duplicate request ID" in error.message
    assert error.engine_status == 400


@pytest.mark.anyio
async def test_health_and_a_closedstarted_engine() -> None:
    async def run(url: str) -> None:
        engine = SGLangHTTPEngine(url)
        assert not await engine.health()  # not started
        await engine.start()
        assert await engine.health()
        await engine.close()
        with pytest.raises(Exception, match="closed"):
            await engine.generate(_request("late", 1))

    with emulator() as (url, _):
        await run(url)


@pytest.mark.anyio
async def test_tokenize_hands_out_the_cached_array_read_only() -> None:
    async def run(url: str) -> None:
        async with started_engine(url) as engine:
            first = await engine.tokenize_array("Hello world")
            again = await engine.tokenize_array("Hello world")
            assert again is first  # no copy per call
            assert first.dtype == np.int32
            assert not first.flags.writeable
            with pytest.raises(ValueError, match="read-only"):
                first[0] = 0
            listed = await engine.tokenize("Hello world")
            assert type(listed) is list and listed == encode("Hello world")
            listed.append(1)  # a caller's own list: the cache is untouched
            assert first.tolist() == encode("Hello world")

    with emulator() as (url, counts):
        await run(url)
        assert counts.paths["/tokenize"] == 1
