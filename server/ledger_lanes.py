"""Where the ledger writer's group commits run: a thread of the server's process.

`server.ledger_writer` decides what goes into each commit; a lane runs it, one at a time, in
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
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, Protocol, TypeVar

from inference_auctions.billing import (
    BatchClaim,
    GroupOutcome,
    HoldInput,
    Ledger,
    ServedInput,
)

__all__ = ["Lane", "ThreadLane"]

log = logging.getLogger(__name__)

T = TypeVar("T")


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
