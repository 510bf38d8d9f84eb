"""The waiting pool: when a batch closes, what the engine can take, and who may take it.

Batching is work-conserving: waiting only pays when it lets the auction order requests that
compete for the engine, so the pool never holds a request back from an engine that could
start it. A batch closes with what the `select` callback takes of the waiting requests as soon
as

- the engine is not saturated (a `saturated` callback, measured by the caller: requests sent
  to the engine that have not started yet), and fewer than `max_inflight` requests are
  outstanding there (a hard cap), and
- the optional collection window has passed: `max_wait` since the oldest waiting request
  arrived, or `batch_size` requests wait, or the pool drains. With `max_wait` 0 (the default)
  a lone request goes straight through.

A batch takes at most `batch_size` requests, the room under `max_inflight`, and, with a
`startable` callback, what the engine can start at its next step. Under the rolling auction
(`server.serving.selection`) `select` orders the whole waiting pool at every closing and takes
that head, so what is not sent is auctioned again with later arrivals; under `scheduling
batches` it takes the oldest requests, whatever they bid.

The pool knows nothing about auctions or engines: it hands each closed batch, with what
`select` says prices it, to a `clear` callback, and asks callbacks how busy the engine is.
Whoever changes the answer of those callbacks (a request starts or leaves the engine, a share
is released) sets the pool's `Wakeup`, which is made before them and handed to each.

What the engine can take now, and what one user or free traffic may hold of it.

SGLang admits waiting requests at each scheduling step, in priority order, up to its
running-request limit and one prefill chunk of tokens (and only what its KV memory holds);
what it cannot admit waits in its own queue, where no later auction can reorder it. So the
server sends the engine no more than it can admit at its next step (`EngineCapacity.startable`),
and keeps everything else in its pool, where the next clearing auctions all of it
(`BatchPool`). The engine counts as saturated when, of the requests sent to it that have no
first token yet,

* their prompt tokens reach one prefill step: `saturation_tokens` when set, else the engine's
  `chunked_prefill_size` (bounded by its `max_total_num_tokens`), else 8,192; or
* their number reaches what the engine can start: `saturation_requests` when set, else its
  running-request limit less the requests of this server running there (so a one-request
  engine takes one at a time), else 32 when the engine states no limit; or
* the engine reports more requests waiting (`/v1/loads`, `num_waiting_reqs`) than this server
  has sent it unstarted: other clients' requests, or requests it retracted for want of memory,
  stand before anything sent now.

A lone request on an idle engine always goes straight through.

The limits come from the engine's `/server_info`: `internal_states[*]` hold the effective values
(`effective_max_running_requests_per_dp`; `max_running_requests` at the top level is only the
flag), read at start and again whenever the engine answers after failing to (it may have
restarted with other flags), and every `_LIMITS_REFRESH_SECONDS`. The waiting queue is polled
every `engine_poll_ms` while requests are outstanding (and at a slow pace otherwise), on one
background task. The emulator states the same facts in the same shapes.

`EngineShares`: what one user, and free traffic as a whole, may hold of the engine at once.

A request holds one of the engine's `max_inflight` slots and its tokens (prompt plus
`max_new_tokens`, what the engine reserves for it) from the batch that takes it until it ends.
When a batch closes, `select` takes the waiting requests in the order it is given (the
auction's, or arrival), skipping those over a share; they stay in the pool for a later
auction rather than fail:

* zero-bid requests together never hold more than `zero_bid_share` of the slots and of the
  engine's tokens, so free traffic cannot fill the engine ahead of bidders who come later (a
  zero-bid request bigger than that token share alone is refused at admission, by name);
  under `pricing fcfs`, where nobody bids, no request counts as free traffic, and under
  `pricing tiers` a free tier's requests do;
* while another user's request waits, a user holding `user_share` of the slots or tokens or
  more gets no more (a user with nothing at the engine may always start one). Alone, a user
  may take everything: a single tenant is never held back.

The engine's tokens are `engine_tokens`, else the embedded emulator's cache, else what an
engine URL states (`max_total_num_tokens` in its `/server_info`); without any, the shares
count slots only.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

from inference_auctions.server.engine.errors import EngineError
from inference_auctions.server.engine.protocol import DEFAULT_MAX_NEW_TOKENS, Engine
from inference_auctions.server.errors import InvalidRequest
from inference_auctions.server.serving.tickets import Ticket
from inference_auctions.server.settings import ServerSettings

__all__ = [
    "FALLBACK_PREFILL_TOKENS",
    "FALLBACK_UNSTARTED_REQUESTS",
    "BatchPool",
    "BatchingPolicy",
    "EngineCapacity",
    "EngineLimits",
    "EngineShares",
    "PoolClosed",
    "QueueFull",
    "Selection",
    "request_tokens",
]

log = logging.getLogger(__name__)

Item = TypeVar("Item")
Context = TypeVar("Context")


class QueueFull(Exception):
    """The pool already holds `max_queue` requests."""


class PoolClosed(Exception):
    """The pool is draining for shutdown and takes no new requests."""


@dataclass(frozen=True, slots=True)
class BatchingPolicy:
    """When a batch may close."""

    batch_size: int
    max_wait: float  # seconds of optional collection window; 0: close at once
    max_inflight: int
    max_queue: int


@dataclass(eq=False)
class _Waiting(Generic[Item]):
    item: Item
    arrived: float = field(default_factory=time.monotonic)


def _never() -> bool:
    return False


class Wakeup:
    """That what the pool asks about the engine may have changed: a batch may close now.

    Made first and handed to the pool and to everything that changes the engine's load (the
    dispatcher, the engine's capacity, the shares), so none of them needs the others."""

    __slots__ = ("_event",)

    def __init__(self) -> None:
        self._event = asyncio.Event()

    def set(self) -> None:
        """The engine's load changed (a request started or left, a share was released)."""
        self._event.set()

    def is_set(self) -> bool:
        """Whether it was set since the pool last cleared it."""
        return self._event.is_set()

    def clear(self) -> None:
        self._event.clear()

    async def wait(self) -> None:
        await self._event.wait()


@dataclass(frozen=True, slots=True)
class Selection(Generic[Context]):
    """What the next batch takes: places in the waiting list, and what the clearing needs to
    price them (the rolling auction's pool order; None where nothing else is needed)."""

    places: list[int]
    context: Context | None = None


class FreeWork(Protocol):
    """Free requests at the engine, or preempted, that yield it to paying ones."""

    # Whether any free request is at the engine or waits to resume (kept up to date by its
    # owner; read at every turn of the pool).
    free_work: bool

    def rebalance(self, room: int, paying_waits: Callable[[], bool]) -> None:
        """Preempt or resume free requests (`server.serving.dispatch`)."""


class BatchPool(Generic[Item, Context]):
    """Collects requests and closes batches whenever the engine can take more (see above)."""

    def __init__(
        self,
        policy: BatchingPolicy,
        clear: Callable[[list[Item], Context | None], Awaitable[None]],
        inflight: Callable[[], int],
        saturated: Callable[[], bool] = _never,
        select: Callable[[list[Item], int], Selection[Context]] | None = None,
        clock: Callable[[], float] = time.monotonic,
        wakeup: Wakeup | None = None,
        startable: Callable[[], int] | None = None,
        yielding: FreeWork | None = None,
        pays: Callable[[Item], bool] | None = None,
    ) -> None:
        """`select(waiting, room)`: the places of the waiting requests a batch takes now, at
        most `room`; by default the oldest. `clock`: seconds, for the collection window.
        `wakeup`: set by whoever changes the engine's load (see above). `startable`: how many
        more requests the engine can start at its next step (None: `batch_size`), which bounds
        every batch besides `max_inflight`. `yielding`: while it has free work at the engine
        or preempted, told at every turn what the engine can start and whether a request that
        pays (`pays`) waits, so that free work can yield the engine to it
        (`server.serving.dispatch`)."""
        self._yielding = yielding
        self._pays = pays
        self._policy = policy
        self._clock = clock
        self._select = select
        self._startable = startable
        # Set when the waiting requests may not go now (`select` took none): the pool waits
        # for a wake-up (a request left the engine, or a new one came).
        self._blocked = False
        self._clear = clear
        self._inflight = inflight
        self._saturated = saturated
        self._waiting: list[_Waiting[Item]] = []
        self._wake = wakeup if wakeup is not None else Wakeup()
        self._draining = False
        self._idle = asyncio.Event()
        self._idle.set()

    def __len__(self) -> int:
        return len(self._waiting)

    def waiting(self) -> list[Item]:
        """The requests waiting now, in arrival order (a copy)."""
        return [waiting.item for waiting in self._waiting]

    def submit(self, item: Item) -> None:
        """Add a request; raises `QueueFull` or `PoolClosed` instead of queueing it."""
        if self._draining:
            raise PoolClosed("the server is shutting down and accepts no new requests")
        if len(self._waiting) >= self._policy.max_queue:
            raise QueueFull(f"{len(self._waiting)} requests are already waiting")
        self._waiting.append(_Waiting(item, self._clock()))
        self._idle.clear()
        self._blocked = False
        self._wake.set()

    def withdraw(self, item: Item) -> bool:
        """Take back a request that no batch has taken yet; False if it is already cleared."""
        for index, waiting in enumerate(self._waiting):
            if waiting.item is item:
                del self._waiting[index]
                self._mark_idle()
                return True
        return False

    def wake(self) -> None:
        """The engine's load changed (a request started or left): a batch may now close."""
        self._wake.set()

    async def drain(self) -> None:
        """Stop taking requests and wait until every waiting one has been cleared."""
        self._draining = True
        self._wake.set()
        await self._idle.wait()

    async def run(self) -> None:
        """Close batches until cancelled."""
        while True:
            self._unblock_if_woken()
            timeout = self._seconds_until_due()
            if timeout is None or timeout > 0:
                # Not `asyncio.wait_for`: on Python 3.11 a cancel that lands in the turn the
                # wait ends (the drain's wake-up, then `stop`) is dropped, and the pool never
                # stops; `asyncio.timeout` keeps it.
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(timeout):
                        await self._wake.wait()
            self._unblock_if_woken()
            yielding = self._yielding
            if yielding is not None and yielding.free_work:  # an attribute: nothing to call
                yielding.rebalance(self._room(), self._paying_waits)
            while self._ready():
                batch, context = self._take(self._room())
                if not batch:
                    self._blocked = True
                    break
                await self._clear([waiting.item for waiting in batch], context)
                self._mark_idle()

    def _paying_waits(self) -> bool:
        pays = self._pays
        return pays is not None and any(pays(waiting.item) for waiting in self._waiting)

    def _room(self) -> int:
        """How many requests the next batch may take: `max_inflight` is a hard cap, and the
        engine's next step (`startable`) bounds it."""
        room = min(self._policy.batch_size, self._policy.max_inflight - self._inflight())
        if self._startable is not None:
            room = min(room, self._startable())
        return room

    def _unblock_if_woken(self) -> None:
        # A wake-up since the pool last looked: the requests it could not take may go now.
        if self._wake.is_set():
            self._wake.clear()
            self._blocked = False

    def _take(self, room: int) -> tuple[list[_Waiting[Item]], Context | None]:
        """Remove and return the requests the next batch takes, and what prices them."""
        if room <= 0:
            return [], None
        if self._select is None:
            batch = self._waiting[:room]
            del self._waiting[:room]
            return batch, None
        selection = self._select([waiting.item for waiting in self._waiting], room)
        batch = [self._waiting[place] for place in selection.places]
        chosen = set(selection.places)
        self._waiting = [w for place, w in enumerate(self._waiting) if place not in chosen]
        return batch, selection.context

    def _engine_busy(self) -> bool:
        """Whether the engine should not be given more now, however long requests wait."""
        return self._inflight() >= self._policy.max_inflight or self._saturated()

    def _ready(self) -> bool:
        if not self._waiting or self._blocked or self._engine_busy():
            return False
        if self._draining or len(self._waiting) >= self._policy.batch_size:
            return True
        return self._clock() - self._waiting[0].arrived >= self._policy.max_wait

    def _seconds_until_due(self) -> float | None:
        """How long until the oldest request's window runs out; None: wait for a wake-up."""
        if not self._waiting or self._blocked or self._engine_busy():
            return None
        return self._waiting[0].arrived + self._policy.max_wait - self._clock()

    def _mark_idle(self) -> None:
        if not self._waiting:
            self._idle.set()


# Used only when neither a setting nor the engine says: an H100's prefill step.
FALLBACK_PREFILL_TOKENS = 8_192
FALLBACK_UNSTARTED_REQUESTS = 32
_LIMITS_REFRESH_SECONDS = 30.0
_IDLE_POLL_SECONDS = 1.0


def _positive_int(value: Any) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    return None


def _first(sources: list[Mapping[str, Any]], *keys: str) -> int | None:
    """The first positive integer under any of `keys`, looking in each source in turn."""
    for source in sources:
        for key in keys:
            value = _positive_int(source.get(key))
            if value is not None:
                return value
    return None


@dataclass(frozen=True, slots=True)
class EngineLimits:
    """What the engine admits per step, as its `/server_info` states it (None: not stated)."""

    max_running_requests: int | None = None
    chunked_prefill_size: int | None = None
    max_total_num_tokens: int | None = None

    @classmethod
    def from_server_info(cls, info: Mapping[str, Any]) -> EngineLimits:
        """Read SGLang's `/server_info`: the effective values in `internal_states` first."""
        states = info.get("internal_states")
        internal = [s for s in states if isinstance(s, Mapping)] if isinstance(states, list) else []
        running = _first(internal, "effective_max_running_requests_per_dp", "max_running_requests")
        if running is not None and len(internal) > 1:
            # One limit per data-parallel rank: the engine runs that many on each.
            running *= len(internal)
        return cls(
            max_running_requests=running or _first([info], "max_running_requests"),
            chunked_prefill_size=_first([*internal, info], "chunked_prefill_size"),
            max_total_num_tokens=_first([info, *internal], "max_total_num_tokens"),
        )

    def prefill_tokens(self) -> int | None:
        """About one prefill step's worth of prompt tokens (None: not stated)."""
        stated = [v for v in (self.chunked_prefill_size, self.max_total_num_tokens) if v]
        return min(stated) if stated else None


def _waiting(loads: Mapping[str, Any]) -> int | None:
    """The requests waiting at the engine, summed over its ranks, from `/v1/loads`."""
    ranks = loads.get("loads")
    entries = ranks if isinstance(ranks, list) else [loads]
    total = 0
    for entry in entries:
        if not isinstance(entry, Mapping):
            return None
        value = entry.get("num_waiting_reqs")
        if not isinstance(value, int) or isinstance(value, bool):
            return None
        total += value
    return total


class EngineCapacity:
    """Whether the engine can take more now (see the module docstring)."""

    def __init__(
        self,
        engine: Engine,
        *,
        tokens_override: int | None,
        requests_override: int | None,
        poll_seconds: float,
        unstarted: Callable[[], int],
        wakeup: Wakeup,
        lookahead: int = 0,
    ) -> None:
        self._engine = engine
        # Requests sent beyond what the engine can start at its next step (a rolling pool's
        # setting: so that a step never waits for this server's round trip).
        self._lookahead = lookahead
        self._tokens_override = tokens_override
        self._requests_override = requests_override
        self._poll_seconds = poll_seconds
        self._unstarted = unstarted  # this server's requests at the engine without a first token
        self._wakeup = wakeup  # set when the engine's answers change what it can take
        self.limits = EngineLimits()
        # Requests waiting at the engine beyond this server's unstarted ones, at the last poll.
        self.excess_waiting = 0
        self._limits_read_at: float | None = None
        self._busy = False  # requests were outstanding since the last poll
        self._task: asyncio.Task[None] | None = None

    # The rule

    def token_budget(self) -> int:
        """Prompt tokens without a first token that saturate the engine."""
        if self._tokens_override is not None:
            return self._tokens_override
        return self.limits.prefill_tokens() or FALLBACK_PREFILL_TOKENS

    def request_budget(self, started: int) -> int:
        """Requests without a first token that saturate the engine, with `started` of this
        server's requests running there."""
        if self._requests_override is not None:
            return self._requests_override
        running_limit = self.limits.max_running_requests
        if running_limit is None:
            return FALLBACK_UNSTARTED_REQUESTS
        return running_limit - started

    def saturated(self, unstarted_tokens: int, unstarted_requests: int, inflight: int) -> bool:
        """Whether what was sent and not started is what the engine can admit next."""
        if inflight > 0:
            self._busy = True
        if self.excess_waiting > 0:
            return True
        if unstarted_tokens >= self.token_budget():
            return True
        budget = self.request_budget(inflight - unstarted_requests) + self._lookahead
        return unstarted_requests >= budget

    def startable(
        self, unstarted_tokens: int, unstarted_requests: int, inflight: int
    ) -> tuple[int, int]:
        """How many more requests, and prompt tokens, the engine can start at its next step
        (with the look-ahead): what a rolling pool sends it, and no more. The last request
        taken may cross the token budget (the engine prefills it in chunks)."""
        if self.excess_waiting > 0:
            return 0, 0
        tokens = self.token_budget() - unstarted_tokens
        budget = self.request_budget(inflight - unstarted_requests) + self._lookahead
        requests = budget - unstarted_requests
        if tokens <= 0 or requests <= 0:
            return 0, 0
        return requests, tokens

    def describe(self) -> dict[str, Any]:
        """The limits in force and where they come from, for `/server_info`."""
        return {
            "saturation_tokens": self.token_budget(),
            "saturation_requests": self.request_budget(0),
            "engine_max_running_requests": self.limits.max_running_requests,
            "engine_chunked_prefill_size": self.limits.chunked_prefill_size,
            "engine_max_total_num_tokens": self.limits.max_total_num_tokens,
            "engine_excess_waiting": self.excess_waiting,
        }

    # Learning the facts

    async def start(self) -> None:
        """Read the engine's limits if it answers now; then keep them and its queue current."""
        await self._read_limits()
        self._task = asyncio.create_task(self._follow(), name="engine-capacity")

    async def close(self) -> None:
        """Stop following the engine."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _read_limits(self) -> bool:
        try:
            info = await self._engine.server_info()
        except EngineError as error:
            log.info("the engine did not state its limits (%s); reading them later", error)
            return False
        if info is None:
            return True  # an engine that states nothing: the settings and fallbacks apply
        limits = EngineLimits.from_server_info(info)
        if limits != self.limits:
            log.info("the engine's limits: %s", limits)
            self.limits = limits
            self._wakeup.set()
        self._limits_read_at = time.monotonic()
        return True

    async def _follow(self) -> None:
        reachable = True
        while True:
            busy = self._busy or self.excess_waiting > 0
            self._busy = False
            await asyncio.sleep(self._poll_seconds if busy else _IDLE_POLL_SECONDS)
            stale = (
                self._limits_read_at is None
                or time.monotonic() - self._limits_read_at > _LIMITS_REFRESH_SECONDS
            )
            if not reachable or stale:
                reachable = await self._read_limits()
                if not reachable:
                    continue
            reachable = await self._read_waiting()

    async def _read_waiting(self) -> bool:
        before = self._unstarted()
        try:
            loads = await self._engine.loads()
        except EngineError:
            if self.excess_waiting:
                self.excess_waiting = 0
                self._wakeup.set()
            return False
        if loads is None:
            return True
        waiting = _waiting(loads)
        if waiting is None:
            return True
        # Ours: the most of this server's unstarted requests while the answer was on its way,
        # so that a request it sent meanwhile is never taken for someone else's.
        excess = max(0, waiting - max(before, self._unstarted()))
        if excess != self.excess_waiting:
            self.excess_waiting = excess
            self._wakeup.set()
        return True


def request_tokens(ticket: Ticket) -> int:
    """What the request holds of the engine's tokens: its prompt and its `max_new_tokens`."""
    asked: Any = ticket.sampling_params.get("max_new_tokens", DEFAULT_MAX_NEW_TOKENS)
    new = asked if isinstance(asked, int) and asked >= 0 else 0
    return len(ticket.tokens) + new


@dataclass
class _Held:
    slots: int = 0
    tokens: int = 0


class EngineShares:
    """The shares of the module docstring, counted from selection to each request's end."""

    def __init__(
        self,
        settings: ServerSettings,
        wakeup: Wakeup,
        learnt_tokens: Callable[[], int | None] = lambda: None,
    ) -> None:
        """`wakeup`: set when a request's share is released (the pool may take more).
        `learnt_tokens`: the engine's KV capacity as it states it (`max_total_num_tokens`),
        used when `engine_tokens` is not set."""
        self._wakeup = wakeup
        self._set_tokens = settings.engine_tokens
        if self._set_tokens is None and settings.engine_url is None:
            self._set_tokens = settings.emulator_cache_tokens
        self._learnt_tokens = learnt_tokens
        self._user_share, self._free_share = settings.user_share, settings.zero_bid_share
        slots = settings.max_inflight
        self._user_slots = max(1, math.floor(slots * settings.user_share))
        self._free_slots = max(1, math.floor(slots * settings.zero_bid_share))
        self._users: defaultdict[str, _Held] = defaultdict(_Held)
        self._free = _Held()
        # Under `pricing fcfs` nobody bids: no request is free traffic held to a share.
        self._free_counted = settings.pricing != "fcfs"

    @property
    def engine_tokens(self) -> int | None:
        """The engine's KV tokens: set, the emulator's, or as the engine states them."""
        return self._set_tokens if self._set_tokens is not None else self._learnt_tokens()

    @property
    def _user_tokens(self) -> float | None:
        capacity = self.engine_tokens
        return None if capacity is None else capacity * self._user_share

    @property
    def _free_tokens(self) -> float | None:
        capacity = self.engine_tokens
        return None if capacity is None else capacity * self._free_share

    def check(self, ticket: Ticket) -> None:
        """Refuse at admission a zero-bid request that could never fit its share."""
        free_tokens = self._free_tokens
        if ticket.bid_micros or free_tokens is None or not self._free_counted:
            return
        tokens = request_tokens(ticket)
        if tokens > free_tokens:
            raise InvalidRequest(
                f"a zero-bid request may hold at most {int(free_tokens):,} tokens of the "
                f"engine (prompt + max_new_tokens; zero_bid_share); this one asks {tokens:,}: "
                "bid for it, or ask for fewer max_new_tokens",
                param="max_new_tokens",
            )

    def select(
        self,
        waiting: Iterable[Ticket],
        room: int,
        token_room: int | None = None,
        *,
        contested: bool | None = None,
    ) -> list[int]:
        """The places in `waiting` (in the order they should go) of the requests a batch of at
        most `room` takes now; with `token_room`, it stops once their prompts reach it (the
        last one may cross it: the engine prefills it in chunks). `waiting` is read only as far
        as needed; `contested` (whether several users wait) is then the caller's to say."""
        if contested is None:
            waiting = list(waiting)
            contested = len({ticket.user for ticket in waiting}) > 1
        taken: list[int] = []
        prompt_tokens = 0
        for place, ticket in enumerate(waiting):
            if len(taken) == room or (token_room is not None and prompt_tokens >= token_room):
                break
            tokens = request_tokens(ticket)
            free = self._free_counted and not ticket.bid_micros
            if free and not self._fits(self._free, tokens, free=True):
                continue
            held = self._users[ticket.user]
            if contested and held.slots and not self._fits(held, tokens, free=False):
                continue
            self._take(ticket, tokens)
            taken.append(place)
            prompt_tokens += len(ticket.tokens)
        return taken

    def _fits(self, held: _Held, tokens: int, *, free: bool) -> bool:
        slots = self._free_slots if free else self._user_slots
        capacity = self._free_tokens if free else self._user_tokens
        if held.slots + 1 > slots:
            return False
        return capacity is None or held.tokens + tokens <= capacity

    def _take(self, ticket: Ticket, tokens: int) -> None:
        held = self._users[ticket.user]
        held.slots += 1
        held.tokens += tokens
        free = self._free_counted and not ticket.bid_micros
        if free:
            self._free.slots += 1
            self._free.tokens += tokens

        def release() -> None:
            held.slots -= 1
            held.tokens -= tokens
            if not held.slots and self._users.get(ticket.user) is held:
                del self._users[ticket.user]
            if free:
                self._free.slots -= 1
                self._free.tokens -= tokens
            self._wakeup.set()

        ticket.on_finish.append(release)
