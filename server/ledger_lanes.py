"""Where the ledger writer's group commits run: a thread of the server, or a process of its own.

`server.ledger_writer` decides what goes into each commit; a lane runs it, one at a time, in
order, with the rarer writes (`call`) in turn between the groups:

* `ThreadLane`: a thread of the server's process, on the server's `Ledger`. Any ledger can
  use it, a SQLite database in memory included, and tests can wrap the ledger's methods;
* `ProcessLane`: a process of its own (`server.ledger_process`), on its own interpreter, so
  that the commits and the event loop never wait for each other's interpreter lock. For a
  database that another process can open (a SQLite file, PostgreSQL), with
  `--ledger-writer process`.

Both hand back exactly what the ledger returned or raised. If the writer process dies, the
requests it had not answered fail with `LedgerUnavailable` (whether their commit happened is
unknown, as when a database connection drops mid-commit), and the next request starts a new
process.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import queue
import socket
import subprocess
import sys
import threading
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, Protocol, TypeVar

from inference_auctions.billing import (
    BatchClaim,
    GroupOutcome,
    HoldRequest,
    Ledger,
    LedgerUnavailable,
    ServedRecord,
    sqlite_busy_timeout_seconds,
)
from inference_auctions.server import ledger_process

__all__ = ["Lane", "ProcessLane", "ThreadLane"]

log = logging.getLogger(__name__)

T = TypeVar("T")

# How long a new writer process may take to import the project and open the ledger.
_START_SECONDS = 60.0
# How long a closing writer process may take to finish its commit and leave.
_STOP_SECONDS = 30.0


class Lane(Protocol):
    """Runs group commits and other ledger writes, one at a time, in the order given."""

    async def start(self) -> None:
        """Be ready before the first request (a lane may also start on its first request)."""

    async def commit(
        self,
        holds: Sequence[HoldRequest],
        claims: Sequence[BatchClaim],
        served: Sequence[ServedRecord],
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
        holds: Sequence[HoldRequest],
        claims: Sequence[BatchClaim],
        served: Sequence[ServedRecord],
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


class ProcessLane:
    """Group commits in a process of their own (see the module docstring)."""

    def __init__(self, url: str, name: str, *, checkpoints: bool) -> None:
        # The URL as the operator gave it: the engine's drops options it applied itself
        # (SQLite's `synchronous`).
        self._config = ledger_process.WriterConfig(
            url=url,
            sqlite_busy_timeout_seconds=sqlite_busy_timeout_seconds(),
            checkpoint_in_background=checkpoints,
        )
        self._name = name
        self._process: subprocess.Popen[bytes] | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._answers: asyncio.Task[None] | None = None
        self._waiting: deque[asyncio.Future[Any]] = deque()
        self._starting: asyncio.Lock | None = None

    @property
    def pid(self) -> int | None:
        """The writer process's id, while one runs."""
        return None if self._process is None else self._process.pid

    async def start(self) -> None:
        if self._starting is None:
            self._starting = asyncio.Lock()
        async with self._starting:
            if self._writer is None:
                await self._spawn()

    async def commit(
        self,
        holds: Sequence[HoldRequest],
        claims: Sequence[BatchClaim],
        served: Sequence[ServedRecord],
    ) -> GroupOutcome:
        outcome: GroupOutcome = await self._request(
            "group", (list(holds), list(served), list(claims))
        )
        return outcome

    async def call(self, work: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        # Only the ledger's own methods cross to the process, by name: they run there on the
        # process's ledger, which is the server's database opened again.
        owner = getattr(work, "__self__", None)
        if not isinstance(owner, Ledger):
            raise TypeError(f"a writer process runs the ledger's methods only, not {work!r}")
        result: T = await self._request("call", (work.__name__, args, kwargs))
        return result

    async def close(self) -> None:
        if self._writer is None:
            return
        if self._waiting:  # what was sent is answered first
            await asyncio.gather(*list(self._waiting), return_exceptions=True)
        answers = self._answers  # it reaps the process once the process has left
        self._writer.close()
        with contextlib.suppress(Exception):
            await self._writer.wait_closed()
        if answers is not None:
            await answers
        await self._reap()

    async def _request(self, kind: str, payload: object) -> Any:
        await self.start()
        assert self._writer is not None
        frame = ledger_process.encode((kind, payload))
        answer: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._waiting.append(answer)
        self._writer.write(frame)
        return await answer

    async def _spawn(self) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            command = [sys.executable, "-m", ledger_process.__name__, str(theirs.fileno())]
            command.append(str(os.getpid()))
            self._process = subprocess.Popen(command, pass_fds=[theirs.fileno()])
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        reader, writer = await asyncio.open_unix_connection(sock=ours)
        writer.write(ledger_process.encode(self._config))
        try:
            ok, value = await asyncio.wait_for(_read_answer(reader), _START_SECONDS)
        except (TimeoutError, asyncio.IncompleteReadError) as error:
            writer.close()
            await self._reap()
            raise LedgerUnavailable(
                f"the ledger writer process did not start ({error or 'it exited'})"
            ) from None
        if not ok:
            writer.close()
            await self._reap()
            raise value
        self._writer = writer
        self._answers = asyncio.get_running_loop().create_task(
            self._read_answers(reader), name=f"{self._name}-answers"
        )
        log.debug("ledger writer process %d started", self._process.pid)

    async def _read_answers(self, reader: asyncio.StreamReader) -> None:
        """Hand each answer to the oldest request waiting; when the process is gone, fail the
        rest and let the next request start a new one."""
        try:
            while True:
                ok, value = await _read_answer(reader)
                answer = self._waiting.popleft()
                if answer.done():
                    continue
                if ok:
                    answer.set_result(value)
                else:
                    answer.set_exception(value)
        except (asyncio.IncompleteReadError, ConnectionError) as error:
            lost = self._waiting
            self._waiting = deque()
            if lost:
                log.error("the ledger writer process exited with %d requests unanswered", len(lost))
            for answer in lost:
                if not answer.done():
                    answer.set_exception(
                        LedgerUnavailable(f"the ledger writer process exited ({error})")
                    )
        finally:
            if self._writer is not None:
                self._writer.close()
            self._writer = None
            self._answers = None
            await self._reap()

    async def _reap(self) -> None:
        process, self._process = self._process, None
        if process is None:
            return
        try:
            await asyncio.to_thread(process.wait, _STOP_SECONDS)
        except subprocess.TimeoutExpired:
            log.error("the ledger writer process %d did not stop; killing it", process.pid)
            process.kill()
            await asyncio.to_thread(process.wait)
        if process.returncode not in (0, None):
            log.error("the ledger writer process exited with code %s", process.returncode)


async def _read_answer(reader: asyncio.StreamReader) -> tuple[bool, Any]:
    """One answer: (True, result) or (False, error); an answer that cannot be read is an error
    of its own request, not the end of the others."""
    header = await reader.readexactly(ledger_process.HEADER_BYTES)
    payload = await reader.readexactly(ledger_process.header_length(header))
    try:
        ok, value = ledger_process.decode(payload)
    except Exception as error:
        log.exception("an answer of the ledger writer process could not be read")
        return False, LedgerUnavailable(f"the ledger writer's answer could not be read: {error}")
    return bool(ok), value
