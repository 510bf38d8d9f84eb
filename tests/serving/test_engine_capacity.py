"""What the engine can take: its limits read from `/server_info`, and the saturation rule."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from inference_auctions.server.emulator.embedded import EmbeddedEngine
from inference_auctions.server.emulator.live import LiveSimulator
from inference_auctions.server.emulator.simulator import EngineSimulator
from inference_auctions.server.engine.errors import EngineUnavailable
from inference_auctions.server.serving.pool import (
    FALLBACK_PREFILL_TOKENS,
    FALLBACK_UNSTARTED_REQUESTS,
    EngineCapacity,
    EngineLimits,
    Wakeup,
)

# The parts of SGLang 0.5.23's `/server_info` that matter, as it answered on a CPU with
# `--max-running-requests 1 --max-total-tokens 16384` (the flag and the effective value).
REAL_SERVER_INFO: dict[str, Any] = {
    "max_running_requests": 1,
    "chunked_prefill_size": 4096,
    "max_total_num_tokens": 16384,
    "internal_states": [
        {
            "max_running_requests": 1,
            "chunked_prefill_size": 4096,
            "effective_max_running_requests_per_dp": 1,
        }
    ],
}


def test_the_effective_limit_is_read_from_the_internal_states() -> None:
    # Without the flag, only the internal state says how many requests it runs.
    info = {**REAL_SERVER_INFO, "max_running_requests": None}
    info["internal_states"] = [
        {"max_running_requests": None, "effective_max_running_requests_per_dp": 48}
    ]
    assert EngineLimits.from_server_info(info) == EngineLimits(48, 4096, 16384)
    assert EngineLimits.from_server_info(REAL_SERVER_INFO).max_running_requests == 1
    two_ranks = {"internal_states": [{"effective_max_running_requests_per_dp": 8}] * 2}
    assert EngineLimits.from_server_info(two_ranks).max_running_requests == 16
    assert EngineLimits.from_server_info({}) == EngineLimits()
    assert EngineLimits(None, 4096, 1000).prefill_tokens() == 1000


class _Engine:
    """An engine that states given facts, or fails to."""

    def __init__(self, info: dict[str, Any] | None, waiting: int = 0) -> None:
        self.info = info
        self.waiting = waiting
        self.down = False

    async def server_info(self) -> dict[str, Any] | None:
        if self.down:
            raise EngineUnavailable("down")
        return self.info

    async def loads(self) -> dict[str, Any] | None:
        if self.down:
            raise EngineUnavailable("down")
        return {"loads": [{"num_waiting_reqs": self.waiting}]}


def _capacity(
    engine: _Engine,
    unstarted: int = 0,
    tokens: int | None = None,
    requests: int | None = None,
) -> tuple[EngineCapacity, Wakeup]:
    woken = Wakeup()
    capacity = EngineCapacity(
        engine,  # type: ignore[arg-type]
        tokens_override=tokens,
        requests_override=requests,
        poll_seconds=0.005,
        unstarted=lambda: unstarted,
        wakeup=woken,
    )
    return capacity, woken


async def _started(capacity: EngineCapacity) -> EngineCapacity:
    await capacity.start()
    return capacity


@pytest.mark.anyio
async def test_a_one_request_engine_takes_one_at_a_time() -> None:
    capacity, woken = _capacity(_Engine(REAL_SERVER_INFO))

    await capacity.start()
    try:
        assert woken.is_set(), "learning new limits wakes the pool"
        # (unstarted tokens, unstarted requests, inflight)
        assert not capacity.saturated(0, 0, 0)  # a lone request on an idle engine goes
        assert capacity.saturated(10, 1, 1)  # sent, no first token yet
        assert capacity.saturated(0, 0, 1)  # running: its one slot is taken
        assert capacity.token_budget() == 4096
    finally:
        await capacity.close()


@pytest.mark.anyio
async def test_a_prefill_step_of_tokens_saturates_a_large_engine() -> None:
    info = {
        "chunked_prefill_size": 4096,
        "internal_states": [{"effective_max_running_requests_per_dp": 512}],
    }
    capacity, _ = _capacity(_Engine(info))

    await capacity.start()
    await capacity.close()
    assert not capacity.saturated(4095, 100, 300)
    assert capacity.saturated(4096, 1, 1)
    assert not capacity.saturated(10, 211, 511)  # 300 running: room for 212
    assert capacity.saturated(10, 212, 512)


@pytest.mark.anyio
async def test_settings_override_what_the_engine_says_and_fallbacks_apply_without_facts() -> None:
    capacity, _ = _capacity(_Engine(REAL_SERVER_INFO), tokens=100, requests=3)
    await _started(capacity)
    assert not capacity.saturated(99, 2, 5)
    assert capacity.saturated(100, 0, 1) and capacity.saturated(0, 3, 3)
    silent, _ = _capacity(_Engine(None))
    await _started(silent)
    assert silent.token_budget() == FALLBACK_PREFILL_TOKENS
    assert silent.request_budget(0) == FALLBACK_UNSTARTED_REQUESTS


@pytest.mark.anyio
async def test_a_waiting_queue_at_the_engine_beyond_its_own_saturates_and_is_followed() -> None:
    engine = _Engine({"internal_states": [{"effective_max_running_requests_per_dp": 64}]}, 3)
    capacity, _ = _capacity(engine, unstarted=1)

    await capacity.start()
    try:
        capacity.saturated(0, 1, 1)  # requests outstanding: poll at the fast pace
        for _ in range(200):
            if capacity.excess_waiting:
                break
            await asyncio.sleep(0.01)
        assert capacity.excess_waiting == 2  # three wait there, one of them is ours
        assert capacity.saturated(0, 0, 0)
        engine.waiting = 0
        for _ in range(200):
            if not capacity.excess_waiting:
                break
            await asyncio.sleep(0.01)
        assert not capacity.saturated(0, 0, 0)
    finally:
        await capacity.close()


@pytest.mark.anyio
async def test_the_limits_are_read_again_once_a_restarted_engine_answers() -> None:
    engine = _Engine(REAL_SERVER_INFO)
    capacity, _ = _capacity(engine)

    await capacity.start()
    try:
        assert capacity.limits.max_running_requests == 1
        engine.down = True
        capacity.saturated(0, 0, 1)
        await asyncio.sleep(0.05)
        engine.info = {"internal_states": [{"effective_max_running_requests_per_dp": 4}]}
        engine.down = False
        for _ in range(300):
            if capacity.limits.max_running_requests == 4:
                break
            capacity.saturated(0, 0, 1)
            await asyncio.sleep(0.01)
        assert capacity.limits.max_running_requests == 4
    finally:
        await capacity.close()


@pytest.mark.anyio
@pytest.mark.parametrize("limit", [None, 2])
async def test_the_emulator_states_its_limits_as_sglang_does(limit: int | None) -> None:
    simulator = EngineSimulator(max_running_requests=limit)
    engine = EmbeddedEngine(LiveSimulator(simulator))

    await engine.start()
    try:
        info, loads = await engine.server_info(), await engine.loads()
    finally:
        await engine.close()
    limits = EngineLimits.from_server_info(info)
    assert limits.max_running_requests == limit
    assert limits.chunked_prefill_size == simulator.chunked_prefill_size
    assert limits.max_total_num_tokens == simulator.cache.capacity
    assert loads["loads"][0]["num_waiting_reqs"] == 0
