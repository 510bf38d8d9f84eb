"""A discrete-event model of one SGLang server: scheduling, radix cache, and time spent.

It follows SGLang 0.5.23's scheduler with `--schedule-policy fcfs` (and, by default,
`--enable-priority-scheduling --schedule-low-priority-values-first`):

* Waiting requests are ordered by priority, then arrival. Without priority scheduling the
  order is arrival only. Admission walks that order and stops at the first request that does
  not fit, so no request ever overtakes a more urgent one.
* Each scheduling round either runs one prefill step (new requests, up to `chunked_prefill_size`
  uncached tokens) or, when nothing can be admitted, one decode step in which every running
  request produces a token (continuous batching). Prefill goes first whenever something fits.
* A request's cached prefix is matched when it is admitted, against the cache as it is then,
  and never covers its last prompt token (SGLang always computes at least one). Its prompt is
  inserted into the cache when its prefill ends, so requests admitted in the same prefill step
  do not share each other's new tokens, exactly as in SGLang's FCFS mode.
* KV memory is the cache's capacity. A request reserves its uncached prompt tokens plus its
  `max_new_tokens` when admitted; running requests lock their path, and admission evicts least
  recently used unlocked leaves to make room. When a request finishes, its prompt and output are
  left in the cache, unlocked.

Simplifications, each of which only shifts times by a step or two: a prompt longer than the
remaining prefill budget waits for the next step instead of being split across steps (a prompt
longer than the whole budget runs alone, paying one step overhead per chunk); the reservation is
the full `max_new_tokens` (SGLang reserves a decaying fraction and retracts on overflow, so it
never needs to here); priority preemption of running requests is not modelled (a server whose
priorities are schedule sequence numbers never triggers it). Requests never stop early: each
produces exactly its `max_new_tokens`.

Time is a plain float clock in seconds, advanced by `advance_to` or `run`. Nothing here reads a
wall clock or does I/O; `server.emulator.live` drives it in real time.
"""

from __future__ import annotations

import heapq
import itertools
import math
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Literal

from inference_auctions.server.emulator.cost_model import CostModel
from inference_auctions.server.emulator.radix_cache import RadixCache, RadixNode

__all__ = [
    "DEFAULT_CACHE_TOKENS",
    "DEFAULT_CHUNKED_PREFILL_SIZE",
    "EngineSimulator",
    "RequestOutcome",
    "SimRequest",
    "SimStats",
    "Step",
]

# The paper's setting: a 32B model on one 80 GB H100 leaves room for about 23k tokens of KV.
DEFAULT_CACHE_TOKENS = 23_000
# SGLang's chunked_prefill_size for GPUs with 60-160 GB of memory.
DEFAULT_CHUNKED_PREFILL_SIZE = 8192


@dataclass(frozen=True, slots=True)
class SimRequest:
    """One generation request as the simulator sees it."""

    rid: str
    input_ids: Sequence[int]
    max_new_tokens: int
    priority: int | None = None
    arrival: float = 0.0
    # The tokens it will produce, cached with its prompt when it finishes; () caches only the
    # prompt.
    output_ids: Sequence[int] = ()


@dataclass(frozen=True, slots=True)
class RequestOutcome:
    """What happened to a request so far; times are simulator seconds (None: not yet)."""

    rid: str
    priority: int | None
    arrival: float
    prompt_tokens: int
    max_new_tokens: int
    cached_tokens: int
    completion_tokens: int
    admitted_at: float | None
    first_token_at: float | None
    finished_at: float | None
    prefill_seconds: float | None
    aborted: bool

    @property
    def finished(self) -> bool:
        """True once it has produced all its tokens or was aborted."""
        return self.finished_at is not None

    @property
    def ttft(self) -> float | None:
        """Time to first token: from arrival to the end of its prefill step."""
        return None if self.first_token_at is None else self.first_token_at - self.arrival

    @property
    def e2e_latency(self) -> float | None:
        """From arrival to its last token."""
        return None if self.finished_at is None else self.finished_at - self.arrival

    @property
    def queue_time(self) -> float | None:
        """From arrival to admission into a prefill step."""
        return None if self.admitted_at is None else self.admitted_at - self.arrival


@dataclass(frozen=True, slots=True)
class Step:
    """One forward step: the requests that got a token at its end, and those that finished."""

    kind: Literal["prefill", "decode"]
    start: float
    end: float
    rids: tuple[str, ...]
    finished: tuple[str, ...]


@dataclass(slots=True)
class SimStats:
    """Totals in the spirit of SGLang's `sglang:*` counters."""

    prompt_tokens: int = 0
    cached_tokens: int = 0
    generation_tokens: int = 0
    finished_requests: int = 0
    aborted_requests: int = 0
    prefill_steps: int = 0
    decode_steps: int = 0
    last_prefill_hit_rate: float = 0.0

    @property
    def cache_hit_rate(self) -> float:
        """Cached prompt tokens over prompt tokens, over every admitted request."""
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


class _Phase(Enum):
    ARRIVING = "arriving"
    WAITING = "waiting"
    PREFILLING = "prefilling"
    RUNNING = "running"
    FINISHED = "finished"
    ABORTED = "aborted"


class _Request:
    """The simulator's mutable record of one request."""

    __slots__ = (
        "abort_requested",
        "admitted_at",
        "cached",
        "completion",
        "extend",
        "finished_at",
        "first_token_at",
        "key",
        "max_new",
        "node",
        "phase",
        "prefill_seconds",
        "request",
        "reserved",
        "sort_key",
    )

    def __init__(self, request: SimRequest, max_new: int, sort_key: tuple[int, float, int]):
        self.request = request
        self.key = tuple(request.input_ids)
        self.max_new = max_new
        self.sort_key = sort_key
        self.phase = _Phase.ARRIVING
        self.node: RadixNode | None = None  # the locked end of its cached path
        self.cached = 0
        self.extend = 0
        self.reserved = 0
        self.completion = 0
        self.admitted_at: float | None = None
        self.first_token_at: float | None = None
        self.finished_at: float | None = None
        self.prefill_seconds: float | None = None
        self.abort_requested = False

    def outcome(self) -> RequestOutcome:
        request = self.request
        return RequestOutcome(
            rid=request.rid,
            priority=request.priority,
            arrival=request.arrival,
            prompt_tokens=len(self.key),
            max_new_tokens=self.max_new,
            cached_tokens=self.cached,
            completion_tokens=self.completion,
            admitted_at=self.admitted_at,
            first_token_at=self.first_token_at,
            finished_at=self.finished_at,
            prefill_seconds=self.prefill_seconds,
            aborted=self.phase is _Phase.ABORTED,
        )


@dataclass(slots=True)
class _PendingStep:
    kind: Literal["prefill", "decode"]
    start: float
    end: float
    requests: list[_Request]


class EngineSimulator:
    """SGLang's scheduling and cache behaviour on a simulated clock (see the module docstring)."""

    def __init__(
        self,
        *,
        cache_tokens: int = DEFAULT_CACHE_TOKENS,
        cost_model: CostModel | None = None,
        chunked_prefill_size: int = DEFAULT_CHUNKED_PREFILL_SIZE,
        max_running_requests: int | None = None,
        priority_scheduling: bool = True,
        low_priority_values_first: bool = True,
    ) -> None:
        if cache_tokens < 2:
            raise ValueError(f"cache_tokens must be >= 2, got {cache_tokens}")
        if chunked_prefill_size < 1:
            raise ValueError(f"chunked_prefill_size must be >= 1, got {chunked_prefill_size}")
        if max_running_requests is not None and max_running_requests < 1:
            raise ValueError(f"max_running_requests must be >= 1, got {max_running_requests}")
        self.cache = RadixCache(cache_tokens)
        self.cost_model = cost_model or CostModel()
        self.chunked_prefill_size = chunked_prefill_size
        self.max_running_requests = max_running_requests
        self.priority_scheduling = priority_scheduling
        self.low_priority_values_first = low_priority_values_first
        self.stats = SimStats()
        self._now = 0.0
        self._order = itertools.count()
        self._requests: dict[str, _Request] = {}
        self._arrivals: list[tuple[float, int, _Request]] = []
        self._waiting: list[tuple[tuple[int, float, int], _Request]] = []
        self._num_waiting = 0
        self._running: dict[str, _Request] = {}
        self._pending: _PendingStep | None = None
        self._reserved = 0  # KV promised to admitted requests but not yet in the cache
        self._context_tokens = 0  # KV held by running requests, read by every decode step
        # Set when the head of the queue did not fit; cleared by anything that could change that.
        self._admission_blocked = False

    @property
    def now(self) -> float:
        """The simulated clock, in seconds."""
        return self._now

    @property
    def num_waiting(self) -> int:
        """Requests arrived and not yet admitted."""
        return self._num_waiting

    @property
    def num_running(self) -> int:
        """Requests admitted and not finished (prefilling or decoding)."""
        pending = self._pending
        prefilling = len(pending.requests) if pending and pending.kind == "prefill" else 0
        return len(self._running) + prefilling

    @property
    def used_tokens(self) -> int:
        """KV tokens in use: cached plus reserved for admitted requests."""
        return self.cache.size + self._reserved

    def submit(self, request: SimRequest) -> None:
        """Add a request arriving at `request.arrival` (not before `now`)."""
        previous = self._requests.get(request.rid)
        if previous is not None and previous.phase not in (_Phase.FINISHED, _Phase.ABORTED):
            raise ValueError(f"Duplicate request ID detected: {request.rid}")
        if request.arrival < self._now or not math.isfinite(request.arrival):
            raise ValueError(f"arrival {request.arrival} is before the clock ({self._now})")
        max_new = self._check_lengths(request)
        sort_key = (self._priority_key(request.priority), request.arrival, next(self._order))
        record = _Request(request, max_new, sort_key)
        self._requests[request.rid] = record
        heapq.heappush(self._arrivals, (request.arrival, sort_key[2], record))

    def abort(self, rid: str) -> bool:
        """Drop a request that has not finished, releasing its memory; False if none."""
        record = self._requests.get(rid)
        if record is None or record.phase in (_Phase.FINISHED, _Phase.ABORTED):
            return False
        if record.phase is _Phase.PREFILLING:
            # Its step is already running; the reservation goes back when the step ends.
            record.abort_requested = True
            return True
        if record.phase is _Phase.WAITING:
            self._num_waiting -= 1  # its heap entry is skipped when it reaches the top
        elif record.phase is _Phase.RUNNING:
            del self._running[rid]
            self._context_tokens -= len(record.key) + record.completion
            self._release(record)
        self._mark_aborted(record)
        return True

    def outcome(self, rid: str) -> RequestOutcome:
        """The current outcome of a request (KeyError if unknown or forgotten)."""
        return self._requests[rid].outcome()

    def forget(self, rid: str) -> None:
        """Drop the record of a finished or aborted request."""
        record = self._requests.get(rid)
        if record is not None and record.phase in (_Phase.FINISHED, _Phase.ABORTED):
            del self._requests[rid]

    def flush_cache(self) -> bool:
        """Empty the cache if no request is waiting or running (as SGLang's /flush_cache)."""
        if self._num_waiting or self._running or self._pending or self._arrivals:
            return False
        self.cache.reset()
        return True

    def next_event_time(self) -> float | None:
        """When the clock next has something to do: a step ends or a request arrives."""
        if self._pending is not None:
            return self._pending.end
        if self._arrivals:
            return self._arrivals[0][0]
        return None

    def advance_to(self, time: float) -> list[Step]:
        """Run every step that ends by `time`; the clock ends at `time` unless a step is open."""
        steps: list[Step] = []
        while True:
            if self._pending is not None:
                if self._pending.end > time:
                    break
                steps.append(self._end_step(self._pending))
            self._take_arrivals()
            if self._start_step():
                continue
            if self._arrivals and self._arrivals[0][0] <= time:
                self._now = self._arrivals[0][0]
                continue
            if math.isfinite(time):
                self._now = max(self._now, time)
            break
        return steps

    def run(self) -> list[Step]:
        """Run until every submitted request has finished."""
        return self.advance_to(math.inf)

    def run_batch(self, requests: Iterable[SimRequest]) -> list[RequestOutcome]:
        """Submit `requests`, run to completion, and return their outcomes in the same order."""
        rids = []
        for request in requests:
            self.submit(request)
            rids.append(request.rid)
        self.run()
        return [self.outcome(rid) for rid in rids]

    def _check_lengths(self, request: SimRequest) -> int:
        """Validate the prompt against the KV capacity; returns max_new_tokens, clipped."""
        if not request.rid:
            raise ValueError("rid must be a non-empty string")
        prompt = len(request.input_ids)
        if prompt == 0:
            raise ValueError("The input_ids must not be empty.")
        limit = self.cache.capacity - 1
        if prompt > limit:
            raise ValueError(
                f"The input ({prompt} tokens) is longer than the model's context length "
                f"({limit} tokens)."
            )
        if request.max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be at least 0, got {request.max_new_tokens}.")
        # SGLang clips the output so that prompt and output fit the context.
        return min(request.max_new_tokens, self.cache.capacity - prompt)

    def _priority_key(self, priority: int | None) -> int:
        if not self.priority_scheduling:
            return 0
        sign = 1 if self.low_priority_values_first else -1
        if priority is None:
            # SGLang gives a request without priority the least urgent value.
            return sys.maxsize
        return sign * priority

    def _take_arrivals(self) -> None:
        while self._arrivals and self._arrivals[0][0] <= self._now:
            _, _, record = heapq.heappop(self._arrivals)
            if record.phase is _Phase.ABORTED:
                continue
            record.phase = _Phase.WAITING
            heapq.heappush(self._waiting, (record.sort_key, record))
            self._num_waiting += 1
            self._admission_blocked = False

    def _start_step(self) -> bool:
        """Start the next step at `now`: a prefill if anything fits, else a decode."""
        if self._num_waiting and not self._admission_blocked:
            batch = self._admit()
            if batch:
                uncached = sum(record.extend for record in batch)
                chunks = max(1, math.ceil(uncached / self.chunked_prefill_size))
                end = self._now + self.cost_model.prefill_time(uncached, chunks)
                self._pending = _PendingStep("prefill", self._now, end, batch)
                return True
            self._admission_blocked = True
        if self._running:
            end = self._now + self.cost_model.decode_time(self._context_tokens)
            self._pending = _PendingStep("decode", self._now, end, list(self._running.values()))
            return True
        return False

    def _admit(self) -> list[_Request]:
        """Take waiting requests in order while they fit in the prefill budget and in memory."""
        batch: list[_Request] = []
        budget = self.chunked_prefill_size
        while self._waiting:
            record = self._waiting[0][1]
            if record.phase is not _Phase.WAITING:
                heapq.heappop(self._waiting)  # aborted while waiting
                continue
            if self.max_running_requests is not None and (
                len(self._running) + len(batch) >= self.max_running_requests
            ):
                break
            match = self.cache.match_prefix(record.key[:-1])
            extend = len(record.key) - match.length
            if batch and extend > budget:
                break
            need = extend + record.max_new
            self.cache.lock(match.node)
            shortfall = need - (self.cache.capacity - self.cache.size - self._reserved)
            if shortfall > 0:
                self.cache.evict(shortfall)
                shortfall = need - (self.cache.capacity - self.cache.size - self._reserved)
            if shortfall > 0:
                self.cache.unlock(match.node)
                break
            heapq.heappop(self._waiting)
            self._num_waiting -= 1
            record.phase = _Phase.PREFILLING
            record.node, record.cached, record.extend = match.node, match.length, extend
            record.reserved = need
            record.admitted_at = self._now
            self._reserved += need
            self.stats.prompt_tokens += len(record.key)
            self.stats.cached_tokens += match.length
            budget -= extend
            batch.append(record)
        if batch:
            prompt = sum(len(record.key) for record in batch)
            self.stats.last_prefill_hit_rate = sum(r.cached for r in batch) / prompt
        return batch

    def _end_step(self, step: _PendingStep) -> Step:
        self._now = step.end
        self._pending = None
        if step.kind == "prefill":
            self.stats.prefill_steps += 1
            return self._end_prefill(step)
        self.stats.decode_steps += 1
        return self._end_decode(step)

    def _end_prefill(self, step: _PendingStep) -> Step:
        produced: list[str] = []
        finished: list[str] = []
        for record in step.requests:
            record.prefill_seconds = step.end - step.start
            if record.abort_requested:
                self._release(record)
                self._mark_aborted(record)
                continue
            self._reserved -= record.extend
            record.reserved -= record.extend
            inserted = self.cache.insert(record.key)
            self.cache.lock(inserted.node)
            assert record.node is not None
            self.cache.unlock(record.node)
            record.node = inserted.node
            record.first_token_at = self._now
            record.phase = _Phase.RUNNING
            if record.max_new > 0:
                record.completion = 1
                self.stats.generation_tokens += 1
                produced.append(record.request.rid)
            self._running[record.request.rid] = record
            self._context_tokens += len(record.key) + record.completion
            if record.completion >= record.max_new:
                self._finish(record)
                finished.append(record.request.rid)
        return Step("prefill", step.start, step.end, tuple(produced), tuple(finished))

    def _end_decode(self, step: _PendingStep) -> Step:
        produced: list[str] = []
        done: list[_Request] = []
        for record in step.requests:
            if record.phase is not _Phase.RUNNING:  # aborted during the step
                continue
            record.completion += 1
            produced.append(record.request.rid)
            if record.completion >= record.max_new:
                done.append(record)
        self._context_tokens += len(produced)
        self.stats.generation_tokens += len(produced)
        for record in done:
            self._finish(record)
        finished = tuple(record.request.rid for record in done)
        return Step("decode", step.start, step.end, tuple(produced), finished)

    def _finish(self, record: _Request) -> None:
        del self._running[record.request.rid]
        self._context_tokens -= len(record.key) + record.completion
        outputs = record.request.output_ids
        if outputs and record.completion > 1:
            # The last token has no KV yet: SGLang caches prompt + output[:-1].
            self._reserved -= record.reserved
            record.reserved = 0
            self.cache.insert(record.key + tuple(outputs[: record.completion - 1]))
        self._release(record)
        record.phase, record.finished_at = _Phase.FINISHED, self._now
        self.stats.finished_requests += 1
        self._admission_blocked = False

    def _mark_aborted(self, record: _Request) -> None:
        record.phase, record.finished_at = _Phase.ABORTED, self._now
        self.stats.aborted_requests += 1
        self._admission_blocked = False

    def _release(self, record: _Request) -> None:
        """Give back a request's reservation and its lock."""
        self._reserved -= record.reserved
        record.reserved = 0
        if record.node is not None:
            self.cache.unlock(record.node)
            record.node = None
        self._admission_blocked = False
