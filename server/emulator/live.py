"""The emulated engine in real time: an asyncio driver over `EngineSimulator`.

One background task keeps the simulator's clock in step with the event loop's: model time is
wall time since `start()` divided by `time_scale`, so with `time_scale=0.01` a 100 ms prefill
takes 1 ms. A submitted request arrives at the current model time; each step the simulator ends
is turned into SGLang-shaped outputs (`server.emulator.sglang_output`) on the request's queue:
the final one for a request that is not streamed; for a streamed one, the final one and those
SGLang's scheduler sends before it: one per token, or with a `stream_interval` k > 1 in its
sampling parameters one at the first token and every k-th after it (token counts 1, k + 1,
2k + 1, ...), which is how a client of SGLang learns of the first token without a chunk per
token.

Reported latencies are model time, so they read as the modelled GPU's whatever the scale. Both
the SGLang-compatible emulator app and the embedded engine consume these outputs, so they
return the same bodies.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator, Sequence
from dataclasses import replace
from http import HTTPStatus
from typing import Any

from inference_auctions.server.emulator.metrics import EmulatorMetrics
from inference_auctions.server.emulator.output_text import Completion, completion
from inference_auctions.server.emulator.sglang_output import abort_reason, generate_output
from inference_auctions.server.emulator.simulator import EngineSimulator, SimRequest, Step

__all__ = ["DEFAULT_MODEL_NAME", "LiveRequest", "LiveSimulator"]

log = logging.getLogger(__name__)


DEFAULT_MODEL_NAME = "emulated-32b-h100"
_UNREAD_OUTPUTS = 16  # a request's unread outputs kept apart; more are merged into the latest


class LiveRequest:
    """A request submitted to a `LiveSimulator`: its outputs as they come."""

    def __init__(
        self,
        owner: LiveSimulator,
        rid: str,
        stream: bool,
        completion: Completion,
        stream_interval: int | None = None,
    ) -> None:
        self.rid = rid
        self.stream = stream
        # SGLang's rule (`stream_output` of its scheduler): a falsy interval is the server's
        # default, 1; above 1 the chunk goes out at token counts k*n + 1.
        self.stream_interval = stream_interval or 1
        self.completion = completion
        self._owner = owner
        # Outputs not read yet. They are cumulative, so past `_UNREAD_OUTPUTS` of them the
        # latest replaces the one before (as SGLang keeps only the latest of a streamed
        # request's unread outputs): a reader that falls behind costs memory linear in the
        # answer, not a pile of ever longer copies.
        self._unread: deque[dict[str, Any]] = deque()
        self._reader: asyncio.Future[None] | None = None
        self._done = False
        self.tokens = 0  # tokens delivered so far

    @property
    def done(self) -> bool:
        """True once the final output has been queued."""
        return self._done

    async def outputs(self) -> AsyncIterator[dict[str, Any]]:
        """SGLang output dicts, cumulative; the last has a non-null `finish_reason`."""
        while True:
            while not self._unread:
                self._reader = asyncio.get_running_loop().create_future()
                await self._reader
            output = self._unread.popleft()
            yield output
            if output["meta_info"]["finish_reason"] is not None:
                return

    def abort(self) -> None:
        """Stop the request (as a client disconnect does); a no-op once it has finished."""
        if not self._done:
            self._owner.abort(self.rid)

    def streams_at(self, tokens: int) -> bool:
        """Whether an unfinished streamed request sends a chunk once it has `tokens` tokens."""
        interval = self.stream_interval
        return tokens % interval == (1 if interval > 1 else 0)

    def _put(self, output: dict[str, Any]) -> None:
        if output["meta_info"]["finish_reason"] is not None:
            self._done = True
        unread = self._unread
        if len(unread) >= _UNREAD_OUTPUTS and unread[-1]["meta_info"]["finish_reason"] is None:
            unread[-1] = output
        else:
            unread.append(output)
        reader, self._reader = self._reader, None
        if reader is not None and not reader.done():
            reader.set_result(None)


class LiveSimulator:
    """Runs an `EngineSimulator` on the event loop's clock (see the module docstring)."""

    def __init__(
        self,
        simulator: EngineSimulator | None = None,
        *,
        time_scale: float = 1.0,
        model_name: str = DEFAULT_MODEL_NAME,
    ) -> None:
        if not time_scale > 0:
            raise ValueError(f"time_scale must be > 0, got {time_scale}")
        self.simulator = simulator or EngineSimulator()
        self.time_scale = time_scale
        self.model_name = model_name
        self.metrics = EmulatorMetrics(self.simulator, model_name)
        self._requests: dict[str, LiveRequest] = {}
        self._aborted: set[str] = set()
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self._start_loop_time = 0.0
        self._start_model_time = 0.0
        self.epoch = time.time()

    @property
    def running(self) -> bool:
        """True between `start()` and `close()`, unless the driver task died."""
        return self._task is not None and not self._task.done()

    async def start(self) -> None:
        """Start the clock and the driver task."""
        if self._task is not None:
            return
        loop = asyncio.get_running_loop()
        self._start_loop_time = loop.time()
        self._start_model_time = self.simulator.now
        self.epoch = time.time() - self.simulator.now
        self._task = asyncio.create_task(self._drive(), name="emulated-engine")

    async def close(self) -> None:
        """Stop the driver; requests still in flight end with an abort."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.wait([task])  # a driver that failed has logged why already
        for rid in list(self._requests):
            self.simulator.abort(rid)
            self._finish_aborted(rid, "The engine was shut down.", HTTPStatus.SERVICE_UNAVAILABLE)

    def model_now(self) -> float:
        """The model time that corresponds to now on the event loop."""
        elapsed = asyncio.get_running_loop().time() - self._start_loop_time
        return max(self.simulator.now, self._start_model_time + elapsed / self.time_scale)

    def submit(
        self,
        input_ids: Sequence[int],
        *,
        max_new_tokens: int,
        rid: str | None = None,
        priority: int | None = None,
        stream: bool = False,
        sampling_seed: int | None = None,
        arrival: float | None = None,
        stream_interval: int | None = None,
    ) -> LiveRequest:
        """Add a request arriving now, or at `arrival` (model time, not in the past).

        Raises ValueError for a duplicate rid or a prompt that cannot fit. Requests submitted
        with one `arrival` are queued together, so the engine orders them by priority even
        when it is idle.
        """
        if not self.running:
            raise RuntimeError("the emulated engine is not running")
        rid = rid or uuid.uuid4().hex
        if rid in self._requests:
            raise ValueError(f"Duplicate request ID detected: {rid}")
        limit = max(0, self.simulator.cache.capacity - len(input_ids))
        length = min(max_new_tokens, limit)
        text = completion(input_ids, length, sampling_seed)
        self.simulator.submit(
            SimRequest(
                rid=rid,
                input_ids=input_ids,
                max_new_tokens=length,
                priority=priority,
                arrival=self.model_now() if arrival is None else arrival,
                output_ids=text.token_ids,
            )
        )
        request = LiveRequest(self, rid, stream, text, stream_interval)
        self._requests[rid] = request
        self._wake.set()  # the driver takes the arrival in at the next step boundary
        return request

    def active_rids(self) -> list[str]:
        """The ids of requests submitted and not finished."""
        return list(self._requests)

    def abort(self, rid: str) -> bool:
        """Abort an unfinished request; its stream ends with an abort output."""
        if rid not in self._requests:
            return False
        self.simulator.abort(rid)
        self._aborted.add(rid)
        self._finish_aborted(rid, "Abort before finishing.", HTTPStatus.BAD_REQUEST)
        self._wake.set()
        return True

    def flush_cache(self) -> bool:
        """Empty the radix cache unless requests are waiting or running."""
        return self.simulator.flush_cache()

    def loads(self) -> dict[str, Any]:
        """One rank's load, as in SGLang's `/v1/loads`."""
        simulator = self.simulator
        capacity = simulator.cache.capacity
        return {
            "dp_rank": 0,
            "num_running_reqs": simulator.num_running,
            "num_waiting_reqs": simulator.num_waiting,
            "num_used_tokens": simulator.used_tokens,
            "max_total_num_tokens": capacity,
            "token_usage": simulator.used_tokens / capacity,
            "cache_hit_rate": simulator.stats.cache_hit_rate,
        }

    def internal_state(self) -> dict[str, Any]:
        """One rank's entry in `/server_info`'s `internal_states`: its load and the effective
        limits, as SGLang's scheduler states them (no running-request limit: none stated)."""
        simulator = self.simulator
        state = {
            **self.loads(),
            "chunked_prefill_size": simulator.chunked_prefill_size,
        }
        if simulator.max_running_requests is not None:
            state["effective_max_running_requests_per_dp"] = simulator.max_running_requests
        return state

    def server_info(self) -> dict[str, Any]:
        """The scheduling facts of SGLang's `/server_info`, as emulated."""
        simulator = self.simulator
        return {
            "model_path": self.model_name,
            "served_model_name": self.model_name,
            "schedule_policy": "fcfs",
            "enable_priority_scheduling": simulator.priority_scheduling,
            "schedule_low_priority_values_first": simulator.low_priority_values_first,
            "chunked_prefill_size": simulator.chunked_prefill_size,
            "max_running_requests": simulator.max_running_requests,
            "max_total_num_tokens": simulator.cache.capacity,
            "internal_states": [self.internal_state()],
        }

    async def _drive(self) -> None:
        try:
            await self._follow_the_clock()
        except Exception:
            # Without a driver nothing would ever finish: fail what is in flight, loudly.
            log.exception("the emulated engine stopped")
            for rid in list(self._requests):
                status = HTTPStatus.INTERNAL_SERVER_ERROR
                self._finish_aborted(rid, "The emulated engine stopped.", status)

    async def _follow_the_clock(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            self._deliver(self.simulator.advance_to(self.model_now()))
            next_time = self.simulator.next_event_time()
            delay = None
            if next_time is not None:
                wall = self._start_loop_time + (next_time - self._start_model_time) * (
                    self.time_scale
                )
                delay = max(0.0, wall - loop.time())
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay):
                    await self._wake.wait()

    def _deliver(self, steps: list[Step]) -> None:
        for step in steps:
            finished = set(step.finished)
            for rid in step.rids:
                request = self._requests.get(rid)
                if request is None:
                    continue
                request.tokens += 1
                if request.stream and rid not in finished and request.streams_at(request.tokens):
                    # Several steps may end in one call: show this step's state, not the last.
                    now = replace(
                        self.simulator.outcome(rid),
                        completion_tokens=request.tokens,
                        finished_at=None,
                    )
                    request._put(generate_output(now, request.completion, epoch=self.epoch))
            for rid in step.finished:
                request = self._requests.pop(rid, None)
                if request is not None:
                    outcome = self.simulator.outcome(rid)
                    request._put(generate_output(outcome, request.completion, epoch=self.epoch))
                    self.metrics.observe(outcome)
                self.simulator.forget(rid)
        # A request aborted mid-prefill is only released when its step ends.
        for rid in list(self._aborted):
            if self.simulator.outcome(rid).finished:
                self.simulator.forget(rid)
                self._aborted.discard(rid)

    def _finish_aborted(self, rid: str, message: str, status: HTTPStatus) -> None:
        request = self._requests.pop(rid, None)
        if request is None:
            return
        reason = abort_reason(message, int(status))
        outcome = self.simulator.outcome(rid)
        request._put(
            generate_output(outcome, request.completion, epoch=self.epoch, finish_reason=reason)
        )
