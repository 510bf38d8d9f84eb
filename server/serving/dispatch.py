"""Handing cleared batches to the engine: in order, prefix-deferred, stopped when clients leave.

`BatchDispatch.dispatch` turns a cleared batch's tickets into engine requests in the
auction's order (each with its clearance's sequence as its priority), hands them to the prefix
deferral (`DeferredDispatch`), each with the driver that follows it on its generation's own
task once it is sent (`server.serving.following.FollowedRequest`: its stream, its outcome, its
refund).

It also counts what the pool needs to decide when to close a batch (`server.serving.pool`): the
requests outstanding at the engine, and those sent but not started (no first token yet), whose
total is how saturated the engine is. Every change of either wakes the pool.

`DeferredDispatch`: the hand-off to the engine, with in-step prefix deferral
(`server.serving.deferral`).

`DeferredDispatch.dispatch` takes a cleared batch's engine requests in the auction's order,
sends at once those the rule lets go, and keeps the others until `first_token` or `ended` of
the request they wait for (the service calls both from its per-request stream), or until
their hold runs out on a timer. A released request keeps the priority the auction gave it, so
the engine still admits it before every request of a later place. With the rule off, or an
engine in `ordered` mode (which never admits two of a batch into one step), every request is
sent at once, exactly as before.

Free requests yield the engine (`BatchDispatch.rebalance`, under `free_traffic idle`): the
scheduler tells the dispatcher at every turn what the engine can start and whether a paying
request waits. A free request at the engine while a paying one is there or waits is stopped
there and parked; once nothing that pays is at the engine or waits, it is sent again, its
prompt followed by what it produced, for the tokens it has left, under a rid of its own, and
its follower goes on with the same answer (`FollowedRequest.preempt`). On a CPU a decode step
costs in proportion to the requests in it, so a free answer started while the engine was idle
would slow every paying request that joins it.

`client_left`: a client that leaves after its batch closed has its generation stopped at once.

Every HTTP handler following a ticket calls `client_left` when its client goes; once none is
left, the ticket is marked and its generation cancelled, which aborts it at the engine (the
emulator aborts a request whose stream is dropped, the SGLang backend also posts
`/abort_request`), freeing its slot. A ticket not sent yet is stopped as soon as it is
(`sent`). What the departed request costs is decided when its follower sees it end
(`server.serving.following`), by the rule of docs/SPEC.md, "A client that leaves": after its first
token it keeps its charge and is recorded `abandoned`; before it, it is `failed` and refunded
by the per-request rule.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from inference_auctions.billing import Ledger
from inference_auctions.server.auction import AuctionOutcome
from inference_auctions.server.engine.protocol import (
    DEFAULT_MAX_NEW_TOKENS,
    Engine,
    EngineRequest,
    Generation,
)
from inference_auctions.server.ledger_writer.writer import LedgerWriter
from inference_auctions.server.metrics import Metrics
from inference_auctions.server.serving.deferral import (
    BatchPrefixes,
    DeferralSettings,
    PrefixDeferral,
    Release,
)
from inference_auctions.server.serving.dispatch_ahead import BatchAhead
from inference_auctions.server.serving.following import FollowedRequest, Follower
from inference_auctions.server.serving.pool import EngineCapacity, Wakeup
from inference_auctions.server.serving.tickets import Clearance, Ticket
from inference_auctions.server.settings import ServerSettings

if TYPE_CHECKING:
    from inference_auctions.server.serving.clearing import ClearedBatch

__all__ = [
    "BatchDispatch",
    "DeferredDispatch",
    "Follow",
    "client_left",
    "deferral_settings",
    "sent",
]


# The engine's start rate is counted over this many seconds, of at most this many starts.
_START_RATE_WINDOW = 10.0
_START_RATE_SAMPLES = 100_000


class BatchDispatch:
    """Sends cleared batches to the engine and follows each request (see the docstring);
    `wakeup` is set whenever the engine may admit more."""

    def __init__(
        self,
        settings: ServerSettings,
        engine: Engine,
        ledger: Ledger,
        writer: LedgerWriter,
        metrics: Metrics,
        wakeup: Wakeup,
    ) -> None:
        self._settings = settings
        self._metrics = metrics
        self._wakeup = wakeup
        # In-step prefix deferral: the dispatcher sends each request when the rule lets it go.
        self._deferral = DeferredDispatch(engine, deferral_settings(settings), metrics)
        self._follower = Follower(settings, ledger, writer, metrics, load=self)
        self.inflight = 0
        # Sent to the engine (or held back by deferral) without a first token yet: engine rid
        # -> prompt tokens. Their total is how saturated the engine is (`saturated`).
        self._unstarted: dict[str, int] = {}
        self._unstarted_tokens = 0
        # Engine rids of the requests at the engine that pay (a positive bid or tier price).
        self._paying: set[str] = set()
        # When recent requests produced their first token: the engine's start rate.
        self._starts: deque[float] = deque(maxlen=_START_RATE_SAMPLES)
        # Recent (overhead, batching wait) of each request, for benchmarks and operators.
        self._timings: deque[tuple[float, float]] = deque(maxlen=100_000)
        # The requests sent and not yet followed to their end (`FollowedRequest.ended`).
        self._followers: set[asyncio.Future[None]] = set()
        # Free requests yield the engine to paying ones (`rebalance`): those at the engine
        # now, by engine rid, the latest sent last; and those preempted, waiting to resume.
        self._yields = (
            settings.free_traffic == "idle"
            and settings.scheduling == "rolling"
            and settings.pricing != "fcfs"
        )
        self._free_running: dict[str, tuple[FollowedRequest, Generation]] = {}
        self._parked: deque[FollowedRequest] = deque()
        # Whether either holds anything: read by the pool at every turn (`FreeWork`).
        self.free_work = False
        self._engine = engine
        self._finishing: set[asyncio.Task[None]] = set()  # parked requests being ended
        self._draining = False
        # What the engine can admit next, learnt from it (`server.serving.pool`).
        self.capacity = EngineCapacity(
            engine,
            tokens_override=settings.saturation_tokens,
            requests_override=settings.saturation_requests,
            poll_seconds=settings.engine_poll_ms / 1000,
            unstarted=lambda: len(self._unstarted),
            wakeup=wakeup,
            lookahead=settings.dispatch_lookahead if settings.scheduling == "rolling" else 0,
        )

    def dispatch(
        self,
        ordered: list[Ticket],
        clearances: list[Clearance],
        batch: ClearedBatch,
        ahead: BatchAhead | None = None,
    ) -> None:
        """Hand the batch to the engine in the auction's order; follow each request. A batch
        sent ahead of its commit (`ahead`) is followed under the commit's verdict."""
        self.inflight += len(ordered)
        requests = []
        now = time.monotonic()
        for ticket, clearance in zip(ordered, clearances, strict=True):
            ticket.dispatched = now
            self._unstarted[ticket.engine_rid] = len(ticket.tokens)
            self._unstarted_tokens += len(ticket.tokens)
            if ticket.bid_micros > 0:
                self._paying.add(ticket.engine_rid)
            self._metrics.dispatch_lag.observe(now - ticket.arrived)
            if ticket.overhead is not None and ticket.batching_wait is not None:
                self._metrics.overhead.observe(ticket.overhead)
                self._timings.append((ticket.overhead, ticket.batching_wait))
            requests.append(
                EngineRequest(
                    rid=ticket.engine_rid,
                    input_ids=ticket.tokens,
                    sampling_params=self._engine_sampling(ticket),
                    priority=clearance.sequence,
                    stream=True,
                    headers=ticket.trace_headers,
                )
            )
        settled = None if ahead is None else ahead.settled
        drivers = [self._follower.follow(ticket, batch, settled) for ticket in ordered]

        def follow(place: int, generation: Generation) -> None:
            followed = drivers[place]
            self._followers.add(followed.ended)
            followed.ended.add_done_callback(self._followers.discard)
            sent(followed.ticket, generation.cancel)
            if ahead is not None:
                ahead.follow(generation, followed.ended)
            if self._yields and followed.ticket.bid_micros <= 0:
                self._free_running[followed.ticket.engine_rid] = (followed, generation)
                self.free_work = True

        self._deferral.dispatch(batch.outcome, requests, drivers, follow)

    async def void(self, ahead: BatchAhead) -> None:
        """Take a batch sent ahead back from the engine, its requests no longer in flight."""
        for engine_rid in await ahead.void(self._deferral):
            self.freed(engine_rid)

    def saturated(self) -> bool:
        """Whether the engine has what it can admit at its next step (`engine_capacity`)."""
        return self.capacity.saturated(self._unstarted_tokens, len(self._unstarted), self.inflight)

    def paying(self) -> int:
        """How many requests that pay are at the engine (sent, not ended)."""
        return len(self._paying)

    def startable(self) -> tuple[int, int]:
        """Requests and prompt tokens the engine can still start at its next step."""
        return self.capacity.startable(self._unstarted_tokens, len(self._unstarted), self.inflight)

    def freed(self, engine_rid: str) -> None:
        """A request left the engine (or failed before it started)."""
        self._unstarted_tokens -= self._unstarted.pop(engine_rid, 0)
        self._paying.discard(engine_rid)
        if self._free_running.pop(engine_rid, None) is not None:
            self.free_work = bool(self._free_running or self._parked)
        self._deferral.ended(engine_rid)  # a request held back for this one's prefix may go
        self.inflight -= 1
        self._wakeup.set()

    def parked(self, followed: FollowedRequest) -> None:
        """A free request was preempted (`rebalance`): it waits to resume; a client that
        leaves meanwhile ends it at once."""
        if self._draining:  # nothing else is left to go first
            self._resume(followed)
            return
        self._parked.append(followed)
        self.free_work = True
        followed.ticket.stop = lambda _reason: self._unpark(followed)
        if followed.ticket.left:
            self._unpark(followed)
        self._wakeup.set()

    def rebalance(self, room: int, paying_waits: Callable[[], bool]) -> None:
        """At a turn of the scheduler, under `free_traffic idle`, free requests use the
        engine only while nothing that pays is there or waits: one at the engine when a
        paying request is there or waits is stopped (it is parked and resumed later from where
        it was, `FollowedRequest.preempt`); with room, and nothing that pays at the engine or
        waiting, the parked ones resume, oldest first. `room`: requests the engine can start
        now; `paying_waits`: whether a paying request waits (asked only when it matters)."""
        if self._free_running and (self._paying or paying_waits()):
            self._preempt_free()
        elif room > 0 and self._parked and not self._paying and not paying_waits():
            for _ in range(min(room, len(self._parked))):
                self._resume(self._parked.popleft())
        self.free_work = bool(self._free_running or self._parked)

    def _preempt_free(self) -> None:
        """Stop every free request at the engine (each is resumed later)."""
        for engine_rid, (followed, generation) in list(self._free_running.items()):
            settled = followed.settled
            if settled is not None and not (settled.done() and settled.result()):
                continue  # sent ahead of its batch's commit: that commit decides it first
            if _tokens_left(followed) < _PREEMPT_TOKENS_LEFT:
                continue  # nearly done: stopping and resuming it costs more than its end
            del self._free_running[engine_rid]
            self._metrics.free_preempted.inc()
            followed.preempt(generation.cancel)

    def _resume(self, followed: FollowedRequest) -> None:
        """Send a preempted request again: its prompt and what it produced so far, for the
        tokens it has left."""
        ticket = followed.ticket
        if ticket.left or ticket.done:
            self._finish_parked(followed)
            return
        produced = followed.produced
        done_ids: list[int] = [] if produced is None else produced.output_ids
        ids = np.concatenate(
            (np.asarray(ticket.tokens, dtype=np.int64), np.asarray(done_ids, dtype=np.int64))
        )
        params = _resumed_sampling(self._engine_sampling(ticket), followed)
        ticket.resent += 1  # a rid of its own at the engine
        clearance = ticket.clearance
        request = EngineRequest(
            rid=ticket.engine_rid,
            input_ids=ids,
            sampling_params=params,
            priority=clearance.sequence if clearance is not None else 0,
            stream=True,
            headers=ticket.trace_headers,
        )
        self.inflight += 1
        self._unstarted[request.rid] = len(ids)
        self._unstarted_tokens += len(ids)
        (generation,) = self._engine.dispatch([request], [followed])
        sent(ticket, generation.cancel)
        self._free_running[request.rid] = (followed, generation)
        self.free_work = True

    def _unpark(self, followed: FollowedRequest) -> None:
        with contextlib.suppress(ValueError):
            self._parked.remove(followed)
            self._finish_parked(followed)
        self.free_work = bool(self._free_running or self._parked)

    def _finish_parked(self, followed: FollowedRequest) -> None:
        task = asyncio.create_task(followed.finish_parked(), context=followed.context)
        self._finishing.add(task)
        task.add_done_callback(self._finishing.discard)

    def recent_timings(self) -> list[tuple[float, float]]:
        """(overhead, batching wait) in seconds of the most recent requests, oldest first."""
        return list(self._timings)

    async def drain(self) -> None:
        """Wait until every request sent has been followed to its end (the preempted ones
        resumed at once: nothing else is left to go first)."""
        self._draining = True
        while self._parked:
            self._resume(self._parked.popleft())
        while self._followers:
            await asyncio.gather(*list(self._followers), return_exceptions=True)

    def close(self) -> None:
        """Stop the deferral's timer; nothing is dispatched afterwards."""
        self._deferral.close()

    def start_rate(self) -> float:
        """First tokens per second over the last `_START_RATE_WINDOW` seconds."""
        since = time.monotonic() - _START_RATE_WINDOW
        recent = 0
        for at in reversed(self._starts):  # newest first: stop at the first one too old
            if at < since:
                break
            recent += 1
        return recent / _START_RATE_WINDOW

    def started(self, engine_rid: str) -> None:
        """A request produced its first token."""
        self._starts.append(time.monotonic())
        self._unstarted_tokens -= self._unstarted.pop(engine_rid, 0)
        self._deferral.first_token(engine_rid)  # a request held back for its prefix may go
        self._wakeup.set()

    def _engine_sampling(self, ticket: Ticket) -> dict[str, Any]:
        """The sampling parameters sent to the engine. Every request is streamed from the
        engine, so that its first token is seen (saturation, deferral); one whose client
        waits for the whole answer asks for a chunk per `engine_stream_interval` tokens
        instead of one per token (SGLang's per-request `stream_interval`: the first token, then
        every k-th), which spares both processes most of the per-chunk work."""
        if ticket.streamed:
            return ticket.sampling_params
        return {**ticket.sampling_params, "stream_interval": self._settings.engine_stream_interval}


# A free request with fewer new tokens than this left is not preempted: its last decode steps
# cost paying requests less than stopping it, and sending it again with its prompt and output.
_PREEMPT_TOKENS_LEFT = 32


def _resumed_sampling(params: dict[str, Any], followed: FollowedRequest) -> dict[str, Any]:
    """The sampling of a preempted request sent again: at most the new tokens it has left,
    and at least what was left of its minimum (the tokens it produced count towards both)."""
    left = max(1, _tokens_left(followed))
    resumed = {**params, "max_new_tokens": left}
    least = params.get("min_new_tokens")
    if isinstance(least, int) and not isinstance(least, bool) and least > 0:
        produced = followed.produced
        done = 0 if produced is None else len(produced.output_ids)
        resumed["min_new_tokens"] = min(left, max(0, least - done))
    return resumed


def _tokens_left(followed: FollowedRequest) -> int:
    """The new tokens a request still may produce: what it asked for (the engine's default
    when it did not say) less what it produced."""
    asked = followed.ticket.sampling_params.get("max_new_tokens")
    limit = asked if isinstance(asked, int) and not isinstance(asked, bool) else None
    produced = followed.produced
    done = 0 if produced is None else len(produced.output_ids)
    return (DEFAULT_MAX_NEW_TOKENS if limit is None else limit) - done


def deferral_settings(settings: ServerSettings) -> DeferralSettings | None:
    """The deferral rule's settings; None when it is off or cannot apply (ordered mode)."""
    if not settings.deferral or settings.engine_mode != "priority":
        return None
    return DeferralSettings(settings.deferral_tokens, settings.deferral_max_hold_ms / 1000)


# Called with each request's place in its batch and its generation once it is sent.
Follow = Callable[[int, Generation], None]


class _Ready(NamedTuple):
    """A request ready to be sent (or held back): its driver, its place in its batch, and
    what is told once it is sent."""

    request: EngineRequest
    driver: FollowedRequest
    place: int
    follow: Follow


class DeferredDispatch:
    """Sends cleared batches to the engine, holding back what the rule says (see the docstring)."""

    def __init__(self, engine: Engine, settings: DeferralSettings | None, metrics: Metrics) -> None:
        self.engine = engine
        self.rule: PrefixDeferral[str] | None = (
            PrefixDeferral(settings) if settings is not None else None
        )
        self._metrics = metrics
        self._held: dict[str, _Ready] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at: float | None = None

    def dispatch(
        self,
        outcome: AuctionOutcome,
        requests: Sequence[EngineRequest],
        drivers: Sequence[FollowedRequest],
        follow: Follow,
    ) -> None:
        """Send a cleared batch (`requests` in `outcome.order`, each followed by its driver);
        `follow` each once it is sent."""
        batch = [
            _Ready(request, driver, place, follow)
            for place, (request, driver) in enumerate(zip(requests, drivers, strict=True))
        ]
        if self.rule is None or len(requests) < 2:
            self._send(batch)
            return
        now = asyncio.get_running_loop().time()
        # Keyed by the engine's rids (a request sent again has a rid of its own there).
        keys = [request.rid for request in requests]
        send = set(self.rule.add_batch(BatchPrefixes.from_outcome(outcome), keys, now))
        ready = []
        for item in batch:
            if item.request.rid in send:
                ready.append(item)
            else:
                self._held[item.request.rid] = item
        self._metrics.deferral_held.inc(len(requests) - len(ready))
        self._send(ready)
        self._arm_timer()

    def first_token(self, rid: str) -> None:
        """`rid` produced its first token: release what waited for its prefix."""
        if self.rule is not None:
            self._release(self.rule.first_token(rid, asyncio.get_running_loop().time()))

    def ended(self, rid: str) -> None:
        """`rid` ended (a no-op after its first token): stop waiting for it."""
        if self.rule is not None:
            self._release(self.rule.ended(rid, asyncio.get_running_loop().time()))

    def withdraw(self, rids: Sequence[str]) -> None:
        """Forget `rids`: those still held back are never sent (their batch was cancelled)."""
        if self.rule is None:
            return
        now = asyncio.get_running_loop().time()
        for rid in rids:
            self._held.pop(rid, None)
        for rid in rids:
            # Anything this releases waited in the same batch, which is withdrawn whole.
            self.rule.ended(rid, now)

    def close(self) -> None:
        """Stop the hold timer."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = self._timer_at = None

    def _release(self, releases: list[Release[str]]) -> None:
        if not releases:
            return
        ready = []
        for release in releases:
            ready.append(self._held.pop(release.key))
            self._metrics.deferral_hold_seconds.observe(release.held_seconds)
            self._metrics.deferral_saved_tokens.inc(release.saved_tokens)
            if release.expired:
                self._metrics.deferral_expired.inc()
        self._send(ready)

    def _send(self, ready: list[_Ready]) -> None:
        if not ready:
            return
        generations = self.engine.dispatch(
            [item.request for item in ready], [item.driver for item in ready]
        )
        for item, generation in zip(ready, generations, strict=True):
            item.follow(item.place, generation)

    def _arm_timer(self) -> None:
        assert self.rule is not None
        deadline = self.rule.next_deadline()
        if deadline is None or (self._timer_at is not None and self._timer_at <= deadline):
            return
        if self._timer is not None:
            self._timer.cancel()
        self._timer_at = deadline
        self._timer = asyncio.get_running_loop().call_at(deadline, self._expire)

    def _expire(self) -> None:
        assert self.rule is not None
        self._timer = self._timer_at = None
        self._release(self.rule.expire(asyncio.get_running_loop().time()))
        self._arm_timer()


_REASON = "the client disconnected"


def client_left(ticket: Ticket) -> None:
    """A client following `ticket` left; stop its work if no other one follows it."""
    if ticket.done or ticket.left or ticket.waiters > 0:
        return
    ticket.left = True
    if ticket.stop is not None:
        ticket.stop(_REASON)


def sent(ticket: Ticket, stop: Callable[[str], None]) -> None:
    """The ticket's generation was sent; `stop` ends it (at once if its client already left)."""
    ticket.stop = stop
    if ticket.left:
        stop(_REASON)
