"""The ledger writer: group commits of the serving path, on threads of the server.

A request used to cost two write transactions of its own (its hold, then its `served` record),
each started from a thread of the shared pool. On SQLite they queued on the database's single
write lock and spent more time waiting for it, and in the ORM around it, than writing.

Now every write of the serving path goes through one lane, a thread of the server
(`ThreadLane`; on PostgreSQL the `served` records go through a second one, below), in order:

* holds that arrive while a commit is running are placed together in the next one
  (`Ledger.commit_group`: one transaction, each hold still decided against what its user has
  available when its turn in the group comes, so nothing overspends);
* closed batches likewise, after the holds of the same group (`claim`: the claim of their
  holds, the auction and the settlement, each in a savepoint of its own), so a request whose
  batch closes while its hold is still queued is held, cleared and settled in one commit;
* `served` records likewise, last (each still conditional on the request being `scheduled`,
  so recovery and serving still race safely); on PostgreSQL in a lane of their own (below);
* the rarer writes (a failure's refund, a release) run in the same lane between the groups
  (`call`).

The writer also knows, between commits, what each user can still afford: what the user had
available when the last group committed (`GroupOutcome.available`) against the bids of the
holds queued since (`affords_queued`). The service dispatches a batch before its settlement
commits only when every user in it affords their queued bids (`server.serving.clearing`).

On PostgreSQL the `served` records have a lane (a thread) and a connection of their own, and
their groups commit while the holds and settlements of the main lane do. A `served` record is
queued only once its request's batch has settled, touches nothing but that request's row and
moves no money, so no order between the two lanes matters; what the split buys is the wait:
every commit there costs round trips to the server, during which one lane would sit idle with
requests waiting on both sides of the engine (measured at 20 connections: 12 to 50% more
requests per second over two alternated series, and about an eighth less CPU per request). On
SQLite a second writer would only queue on the database's one write lock, so there everything
stays in one lane.

A request waits for at most one commit in progress before its own is written, and the event
loop hands work to the lane once per group, not once per request. A group starts one turn
of the event loop after it could, so that the batch a new request closes (the pool runs in
that turn) rides in the same commit as the request's hold, and the next batch the pool closes
after a settlement rides in the very next commit.

Where the ledger writer's group commits run: a thread of the server's process.

`LedgerWriter` decides what goes into each commit; a lane runs it, one at a time, in
order, with the rarer writes (`call`) in turn between the groups, on the server's `Ledger`,
and hands back exactly what the ledger returned or raised. Any ledger can use it, a SQLite
database in memory included, and tests can wrap the ledger's methods.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, NamedTuple, Protocol, TypeVar

from inference_auctions.billing import (
    BatchClaim,
    ClaimedBatch,
    GroupOutcome,
    HoldInput,
    HoldView,
    Ledger,
    ServedInput,
)

__all__ = ["Lane", "LedgerWriter", "ThreadLane"]

T = TypeVar("T")

log = logging.getLogger(__name__)

# How long a failed commit, with none succeeding after it, makes the ledger count as unable
# to write: past it, with no traffic to tell, `/health` gives the database another chance.
_FAILED_FRESH = 30.0

# A bound on one transaction, so a flood of holds cannot build one commit that blocks the
# settlements behind it for long; what is left goes into the next commit at once.
_MAX_GROUP = 512


class LedgerWriter:
    """Groups the serving path's ledger writes into one lane (see the module docstring)."""

    def __init__(
        self,
        ledger: Ledger,
        *,
        max_group: int = _MAX_GROUP,
        observe_group: Callable[[int], None] = lambda _: None,
        served_apart: bool | None = None,
    ) -> None:
        self._observe_group = observe_group  # writes per committed group, for the metrics
        self._max_group = max_group
        # `served` records in a lane of their own (see the module docstring); by default on
        # PostgreSQL, and only there.
        if served_apart is None:
            served_apart = ledger.dialect_name == "postgresql"
        # Where the commits run: threads of this process (`ThreadLane`, below).
        self._lane: Lane = ThreadLane(ledger, "ledger-writer")
        self._served_lane: Lane | None = None
        if served_apart:
            self._served_lane = ThreadLane(ledger, "ledger-served")
        self._holds: list[tuple[HoldInput, asyncio.Future[HoldView]]] = []
        self._claims: list[tuple[BatchClaim, asyncio.Future[ClaimedBatch]]] = []
        self._served: list[tuple[ServedInput, asyncio.Future[bool]]] = []
        # Each lane's groups are committed by one task of the writer's, started once and woken
        # when something is queued: no task per group (`_GroupRunner`).
        self._groups = _GroupRunner("ledger-group-commit", self._pending, self._commit_next)
        self._served_groups: _GroupRunner | None = None
        if self._served_lane is not None:
            served_lane = self._served_lane
            self._served_groups = _GroupRunner(
                "ledger-served-commit",
                lambda: bool(self._served),
                lambda: self._commit_next_served(served_lane),
            )
        # Per user: available funds as of the last commit, and the bids queued since.
        self._available: dict[str, int] = {}
        self._queued_bids: dict[str, int] = {}
        self._failed: tuple[float, str] | None = None  # (when, why) the last commit failed

    async def start(self) -> None:
        """Have the lanes ready before the first request."""
        await self._lane.start()
        self._groups.start()
        if self._served_lane is not None:
            await self._served_lane.start()
        if self._served_groups is not None:
            self._served_groups.start()

    def queue_hold(self, request: HoldInput) -> asyncio.Future[HoldView]:
        """Queue one hold for the next group commit, now; its future is the outcome (what
        `Ledger.place_hold` returns or raises). A batch claimed after this call sees the hold
        (same group or a later one)."""
        future: asyncio.Future[HoldView] = asyncio.get_running_loop().create_future()
        self._holds.append((request, future))
        self._queued_bids[request.user] = (
            self._queued_bids.get(request.user, 0) + request.amount_micros
        )
        self._kick()
        return future

    @property
    def serves_apart(self) -> bool:
        """Whether `served` records go through a lane of their own (see the module docstring)."""
        return self._served_lane is not None

    def affords_queued(self, user: str) -> bool:
        """Whether every hold queued for `user` would be placed, as far as the last commit
        tells: the user was enabled, had no batch cap, and had available at least the sum of
        the bids queued since. An estimate (another replica, an operator or a new budget
        period may have changed the balance since), which the next commit confirms or not."""
        available = self._available.get(user)
        return available is not None and self._queued_bids.get(user, 0) <= available

    async def claim(self, claim: BatchClaim) -> ClaimedBatch:
        """Claim, clear and settle a closed batch in the next group commit, after its holds;
        raises what the claim raised (its writes undone) or what failed the group."""
        return await self.queue_claim(claim)

    def queue_claim(self, claim: BatchClaim) -> asyncio.Future[ClaimedBatch]:
        """`claim`, queued now (in the same commit as the holds queued this turn); its future
        is the outcome."""
        future: asyncio.Future[ClaimedBatch] = asyncio.get_running_loop().create_future()
        self._claims.append((claim, future))
        self._kick()
        return future

    async def served(self, record: ServedInput) -> bool:
        """Record one request served in the next group commit; False if it was no longer
        `scheduled` (recovery recorded it unserved first)."""
        future: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._served.append((record, future))
        if self._served_groups is None:
            self._kick()
        else:
            self._served_groups.wake()
        return await future

    async def call(self, work: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run another ledger write (a method of the ledger) in the writer's lane, in turn with
        the groups."""
        return await self._lane.call(work, *args, **kwargs)

    async def close(self) -> None:
        """Commit what is queued, then stop the lanes."""
        await self._groups.close()
        if self._served_groups is not None:
            await self._served_groups.close()
        await self._lane.close()
        if self._served_lane is not None:
            await self._served_lane.close()

    def _kick(self) -> None:
        self._groups.wake()

    def _pending(self) -> bool:
        served = self._served if self._served_lane is None else []
        return bool(self._holds or self._claims or served)

    async def _commit_next(self) -> None:
        """Commit the next group of the main lane: holds, then claims, then (unless they
        have a lane of their own) `served` records."""
        holds = _take(self._holds, self._max_group)
        claims = _take(self._claims, self._max_group)
        served = _take(self._served, self._max_group) if self._served_lane is None else []
        outcome = await self._commit(
            self._lane,
            [request for request, _ in holds],
            [claim for claim, _ in claims],
            [record for record, _ in served],
        )
        self._account(holds, outcome)
        if isinstance(outcome, Exception):  # nothing of the group was written
            for waiting in (holds, claims, served):
                _settle(waiting, [outcome] * len(waiting))
            return
        # Holds first: a request's own hold error is known before its batch's outcome.
        _settle(holds, outcome.placed)
        _settle(claims, outcome.claimed)
        _settle(served, outcome.served)

    async def _commit_next_served(self, lane: Lane) -> None:
        """The `served` lane's next group: what `_commit_next` does, for the records alone."""
        served = _take(self._served, self._max_group)
        outcome = await self._commit(lane, [], [], [record for record, _ in served])
        if isinstance(outcome, Exception):
            _settle(served, [outcome] * len(served))
        else:
            _settle(served, outcome.served)

    def _account(
        self,
        holds: list[tuple[HoldInput, asyncio.Future[HoldView]]],
        outcome: GroupOutcome | Exception,
    ) -> None:
        """The group's bids are no longer queued; its users' funds are as it left them."""
        for request, _ in holds:
            left = self._queued_bids.get(request.user, 0) - request.amount_micros
            if left > 0:
                self._queued_bids[request.user] = left
            else:
                self._queued_bids.pop(request.user, None)
        if isinstance(outcome, Exception):
            for request, _ in holds:
                self._available.pop(request.user, None)  # unknown until a commit tells again
            return
        for request, _ in holds:
            if request.user not in outcome.available:  # disabled, capped or unknown now
                self._available.pop(request.user, None)
        self._available.update(outcome.available)

    async def _commit(
        self,
        lane: Lane,
        holds: list[HoldInput],
        claims: list[BatchClaim],
        served: list[ServedInput],
    ) -> GroupOutcome | Exception:
        """The group in one transaction, or the error that failed it as a whole."""
        try:
            outcome = await lane.commit(holds, claims, served)
        except Exception as error:
            # The error's kind only: a database's message may quote statements and values.
            self._failed = (time.monotonic(), type(error).__name__)
            return error
        self._failed = None
        self._observe_group(len(holds) + len(claims) + len(served))
        return outcome

    def cannot_write(self) -> str | None:
        """Why the ledger cannot write, if its last commit failed (within `_FAILED_FRESH`
        seconds) and none succeeded since; None otherwise. A database that answers reads may
        still refuse writes (a full disk, a lock held past its timeout): `/health` asks this."""
        failed = self._failed
        if failed is None or time.monotonic() - failed[0] > _FAILED_FRESH:
            return None
        seconds = time.monotonic() - failed[0]
        return f"its last commit failed {seconds:.0f} s ago ({failed[1]})"


def _take(queue: list[T], most: int) -> list[T]:
    """Up to `most` items from the front of `queue`, removed from it."""
    taken = queue[:most]
    del queue[: len(taken)]
    return taken


def _settle(waiting: Sequence[tuple[Any, asyncio.Future[Any]]], results: Sequence[Any]) -> None:
    """Hand each waiter its result; one that gave up meanwhile is skipped."""
    for (_, future), result in zip(waiting, results, strict=True):
        if future.done():
            continue
        if isinstance(result, BaseException):
            future.set_exception(result)
        else:
            future.set_result(result)


class _GroupRunner:
    """Commits a lane's groups on one long-lived task, woken when something is queued.

    A task per group would cost every lone request a task created, and its scheduling, for
    each of its commits; this one waits on a future of its own while nothing is queued. Before
    each commit it lets one turn of the loop pass, so that what that turn queues joins the
    commit instead of waiting for the next one (the batch a new request closes; after a
    commit, the next batch, which the pool closes as soon as it has dispatched the batch this
    writer just settled).
    """

    def __init__(
        self, name: str, pending: Callable[[], bool], commit_next: Callable[[], Awaitable[None]]
    ) -> None:
        self._name = name
        self._pending = pending
        self._commit_next = commit_next
        self._task: asyncio.Task[None] | None = None
        self._idle: asyncio.Future[None] | None = None  # resolved by `wake` while it waits
        self._closing = False

    def start(self) -> None:
        """Start the task now rather than on the first write."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name=self._name)
            self._task.add_done_callback(self._ended)

    def wake(self) -> None:
        """Something was queued: commit it soon."""
        if self._task is None:
            self.start()
            return
        idle = self._idle
        if idle is not None and not idle.done():
            idle.set_result(None)

    async def close(self) -> None:
        """Commit what is queued, then end the task."""
        self._closing = True
        task = self._task
        if task is None:
            return
        self.wake()
        await asyncio.shield(task)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            if not self._pending():
                if self._closing:
                    return
                self._idle = loop.create_future()
                try:
                    await self._idle
                finally:
                    self._idle = None
            await asyncio.sleep(0)
            if self._pending():
                await self._commit_next()

    def _ended(self, task: asyncio.Task[None]) -> None:
        # Only a bug ends the loop early: say so, and let the next write start a new task,
        # so that nothing queued is stranded.
        self._task = None
        if not task.cancelled() and task.exception() is not None:
            log.error("the ledger writer's %s task failed", self._name, exc_info=task.exception())
        if self._pending() and not self._closing:
            self.start()


class Lane(Protocol):
    """Runs group commits and other ledger writes, one at a time, in the order given."""

    async def start(self) -> None:
        """Be ready before the first request (a lane may also start on its first request)."""

    async def commit(
        self,
        holds: Sequence[HoldInput],
        claims: Sequence[BatchClaim],
        served: Sequence[ServedInput],
    ) -> GroupOutcome:
        """`Ledger.commit_group`; raises what failed the group as a whole."""

    async def call(self, work: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Another ledger write, a method of the ledger, in turn with the groups."""

    async def close(self) -> None:
        """Finish what was sent, then stop."""


class ThreadLane:
    """Group commits on a thread of the server (see the module docstring).

    One thread of its own, fed through a queue, that hands each result back to the event loop
    with one `call_soon_threadsafe`. A `ThreadPoolExecutor` does the same with more machinery
    on both sides of every commit (a `concurrent.futures.Future` with its lock and condition,
    chained to an asyncio future by callbacks), which a lone request pays twice (its hold and
    settlement, its `served` record) on the event loop."""

    def __init__(self, ledger: Ledger, name: str) -> None:
        self._ledger = ledger
        self._name = name
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._closed = False

    async def start(self) -> None:
        return None

    async def commit(
        self,
        holds: Sequence[HoldInput],
        claims: Sequence[BatchClaim],
        served: Sequence[ServedInput],
    ) -> GroupOutcome:
        return await self._submit(self._ledger.commit_group, (holds, served, claims), {})

    async def call(self, work: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        return await self._submit(work, args, kwargs)

    async def close(self) -> None:
        self._closed = True
        thread, self._thread = self._thread, None
        if thread is not None:
            self._jobs.put(None)  # after every job sent: they finish first
            thread.join()

    def _submit(
        self, work: Callable[..., T], args: Sequence[Any], kwargs: dict[str, Any]
    ) -> asyncio.Future[T]:
        if self._closed:
            raise RuntimeError(f"the ledger lane {self._name!r} is closed")
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        if self._thread is None:
            # A daemon, so that a lane nobody closed never keeps the interpreter from exiting;
            # a commit cut short that way is rolled back by the database, as after a crash.
            self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
            self._thread.start()
        self._jobs.put(_Job(loop, future, work, args, kwargs))
        return future

    def _run(self) -> None:
        """The lane's thread: each job in order, until the `None` that `close` sends."""
        while (job := self._jobs.get()) is not None:
            # A caller that was cancelled before its job started gets nothing run for it,
            # as with an executor (the future is only read here; the loop owns it).
            if job.future.cancelled():
                continue
            try:
                result = job.work(*job.args, **job.kwargs)
            except BaseException as error:  # handed to the waiter, as an executor does
                job.hand_back(_fail, error)
            else:
                job.hand_back(_resolve, result)


class _Job(NamedTuple):
    """One call for a `ThreadLane`, and where its outcome goes."""

    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[Any]
    work: Callable[..., Any]
    args: Sequence[Any]
    kwargs: dict[str, Any]

    def hand_back(self, settle: Callable[[asyncio.Future[Any], Any], None], value: Any) -> None:
        """Settle the future on its loop's thread; nothing to do once that loop is closed."""
        with contextlib.suppress(RuntimeError):
            self.loop.call_soon_threadsafe(settle, self.future, value)


def _resolve(future: asyncio.Future[Any], result: Any) -> None:
    if not future.done():  # the waiter may have been cancelled meanwhile
        future.set_result(result)


def _fail(future: asyncio.Future[Any], error: BaseException) -> None:
    if future.done():
        return
    if isinstance(error, StopIteration):  # an asyncio future refuses it: the waiter would hang
        wrapped = RuntimeError(f"the call raised StopIteration: {error}")
        wrapped.__cause__ = error
        error = wrapped
    future.set_exception(error)
