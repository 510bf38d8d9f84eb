"""The walk of one request through the project's code: modules, functions, crossings, returns.

A newcomer reads the serving path by following one request. This measures that walk on the
running product: the auction server in this process (uvicorn in a thread, an SQLite or
PostgreSQL ledger) in front of the SGLang emulator in a process of its own
(`emulate-sglang`), a few warm-up requests, then one `POST /generate` with a bid, traced from
the moment it is sent until its answer has been read.

Every Python call into the project's modules (`inference_auctions.*`), on every thread of
the process, is an event; a coroutine or generator resumed counts as a call, as the
interpreter reports it. Within each thread, consecutive events in two different modules are
a *crossing*, and a crossing into a module that thread had already visited is a *return*.
Periodic work that happens to run during the request (an engine poll, a heartbeat) is counted
with it, as a reader would meet it.

The walk's hand-offs are counted too (`--handoffs` prints them): the asyncio tasks created
(each named by the coroutine it runs), each task's steps (a task suspended `n` times runs
`n + 1` steps, each a resumption of its outermost coroutine), and the trips to other threads
(a job handed to a ledger lane's thread, `asyncio.to_thread`, `run_in_executor`), each one
there and one back to the event loop.

Run: `python -m bench.request_walk` (`--database-url` for PostgreSQL, `--walk` prints the
crossings in order, `--json` the figures). `--as billing.fees=billing.settlement` counts one
module's calls as another's (a folder's, all its modules'): what a merge would save, measured
before moving any code.
`tests/bench/test_request_walk.py` keeps the counts within the limits docs/dev/architecture.md
states.
"""

from __future__ import annotations

import argparse
import asyncio
import dis
import functools
import http.client
import inspect
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import CodeType, FrameType
from typing import Any

import uvicorn
from rich.console import Console
from rich.table import Table

from inference_auctions.billing import Ledger, upgrade_schema
from inference_auctions.server.api.connections import uvicorn_config
from inference_auctions.server.app import create_app
from inference_auctions.server.settings import ServerSettings

PROJECT = "inference_auctions."
WARM_UP_REQUESTS = 5
BID_MICROS = 10_000


@dataclass
class ThreadWalk:
    """The events of one thread, in order, and what they crossed."""

    modules: list[str] = field(default_factory=list)
    crossings: int = 0
    returns: int = 0
    steps: list[tuple[str, str]] = field(default_factory=list)

    def enter(self, module: str) -> None:
        last = self.modules[-1] if self.modules else None
        if module == last:
            return
        if last is not None:
            self.crossings += 1
            self.steps.append((last, module))
            if module in self.modules:
                self.returns += 1
        self.modules.append(module)


@dataclass(frozen=True)
class Handoffs:
    """What one request handed from task to task and thread to thread."""

    tasks_created: list[str]  # the coroutine each new task runs, in order of first step
    task_steps: dict[str, int]  # per task (its coroutine, numbered): steps run
    thread_trips: dict[str, int]  # per way: jobs handed to another thread

    def route_suspensions(self) -> int:
        """How often the task that runs the route (uvicorn's ASGI cycle) was suspended."""
        steps = [n for task, n in self.task_steps.items() if "run_asgi" in task]
        return max(steps) - 1 if steps else 0

    def figures(self) -> dict[str, int]:
        return {
            "tasks created": len(self.tasks_created),
            "tasks that ran": len(self.task_steps),
            "task steps": sum(self.task_steps.values()),
            "route task suspensions": self.route_suspensions(),
            "trips to other threads": sum(self.thread_trips.values()),
        }


# The calls that hand work to another thread, by where they are defined: (module, qualname).
_THREAD_TRIPS = {
    ("inference_auctions.server.ledger_writer.writer", "ThreadLane._submit"): "ledger lane",
    ("asyncio.threads", "to_thread"): "asyncio.to_thread",
    # Under asyncio's own loop (uvloop's is compiled: it shows no calls); `to_thread`'s
    # own call of it is counted as `to_thread`.
    ("asyncio.base_events", "BaseEventLoop.run_in_executor"): "run_in_executor",
}


@functools.cache
def _first_resume(code: CodeType) -> int:
    """Where a coroutine's first step starts: its code's first RESUME instruction."""
    return next(i.offset for i in dis.get_instructions(code) if i.opname == "RESUME")


@dataclass(frozen=True)
class Walk:
    """What one request's walk touched, over all threads."""

    modules: dict[str, int]
    functions: int
    calls: int
    crossings: int
    returns: int
    threads: int
    steps: list[tuple[str, str, str]]

    def figures(self) -> dict[str, int]:
        return {
            "modules": len(self.modules),
            "functions": self.functions,
            "calls": self.calls,
            "crossings": self.crossings,
            "returns": self.returns,
            "threads": self.threads,
        }


class WalkTracer:
    """A profile hook on every thread that records calls into the project while switched on.

    Installed before the server starts (`threading.setprofile` reaches only threads started
    after it), it costs a check per call while off.
    """

    def __init__(self, grouped: Mapping[str, str] | None = None) -> None:
        """`grouped`: module or folder -> the module its calls count as (names without the
        project's prefix)."""
        self._grouped = dict(grouped or {})
        self._on = False
        self._lock = threading.Lock()
        self._threads: dict[int, ThreadWalk] = {}
        self._calls: dict[tuple[str, str], int] = {}
        self._tasks_created: list[str] = []
        # Per task: its name, its steps (the task itself the key: an id could be reused)
        self._task_steps: dict[asyncio.Task[Any], tuple[str, int]] = {}
        self._thread_trips: dict[str, int] = {}

    def install(self) -> None:
        threading.setprofile(self._hook)
        sys.setprofile(self._hook)

    def uninstall(self) -> None:
        threading.setprofile(None)
        sys.setprofile(None)

    @contextmanager
    def recording(self) -> Iterator[None]:
        self._on = True
        try:
            yield
        finally:
            self._on = False

    def _hook(self, frame: FrameType, event: str, _arg: Any) -> None:
        if not self._on or event != "call":
            return
        module = frame.f_globals.get("__name__", "")
        if frame.f_code.co_flags & inspect.CO_COROUTINE:
            self._coroutine_resumed(frame)
        trip = _THREAD_TRIPS.get((module, frame.f_code.co_qualname))
        if trip is not None and self._new_trip(frame):
            with self._lock:
                self._thread_trips[trip] = self._thread_trips.get(trip, 0) + 1
        if not module.startswith(PROJECT):
            return
        name = self._counted_as(module[len(PROJECT) :])
        key = (name, frame.f_code.co_qualname)
        thread = threading.get_ident()
        with self._lock:
            self._calls[key] = self._calls.get(key, 0) + 1
            self._threads.setdefault(thread, ThreadWalk()).enter(name)

    @staticmethod
    def _new_trip(frame: FrameType) -> bool:
        """Whether a call of one of `_THREAD_TRIPS` hands a new job over: a coroutine's first
        step only, and an executor's job once however it was asked for."""
        if frame.f_code.co_flags & inspect.CO_COROUTINE:
            return frame.f_lasti == _first_resume(frame.f_code)
        caller = frame.f_back
        return caller is None or caller.f_code.co_qualname != "to_thread"

    def _coroutine_resumed(self, frame: FrameType) -> None:
        """A coroutine frame starts or resumes: a step of its task when it is the task's
        outermost coroutine."""
        try:
            task = asyncio.current_task()
        except RuntimeError:  # no loop running on this thread
            return
        if task is None:
            return
        coroutine = task.get_coro()
        if getattr(coroutine, "cr_frame", None) is not frame:
            return
        name = frame.f_code.co_qualname
        with self._lock:
            if frame.f_lasti == _first_resume(frame.f_code):
                # Its first step: the task was created while the request was traced (a
                # task's creation is in C under uvloop, where a profile hook cannot see it).
                self._tasks_created.append(name)
            name, steps = self._task_steps.get(task, (name, 0))
            self._task_steps[task] = (name, steps + 1)

    def handoffs(self) -> Handoffs:
        with self._lock:
            steps: dict[str, int] = {}
            for number, (name, count) in enumerate(self._task_steps.values()):
                steps[f"{name} #{number}"] = count
            return Handoffs(list(self._tasks_created), steps, dict(self._thread_trips))

    def _counted_as(self, module: str) -> str:
        """The module `grouped` counts `module`'s calls as: its own entry, else that of the
        nearest folder above it (`server.serving` takes every module of that room)."""
        name = module
        while name:
            if name in self._grouped:
                return self._grouped[name]
            name = name.rpartition(".")[0]
        return module

    def walk(self) -> Walk:
        with self._lock:
            modules: dict[str, int] = {}
            for (module, _), count in self._calls.items():
                modules[module] = modules.get(module, 0) + count
            steps = [
                (str(index), before, after)
                for index, thread in enumerate(self._threads.values())
                for before, after in thread.steps
            ]
            return Walk(
                modules=dict(sorted(modules.items(), key=lambda item: -item[1])),
                functions=len(self._calls),
                calls=sum(self._calls.values()),
                crossings=sum(thread.crossings for thread in self._threads.values()),
                returns=sum(thread.returns for thread in self._threads.values()),
                threads=len(self._threads),
                steps=steps,
            )


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _wait_healthy(port: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            status, _ = _request(port, "GET", "/health", None, None)
            if status == 200:
                return
        except OSError:
            pass
        time.sleep(0.05)
    raise RuntimeError(f"nothing healthy on port {port} after {timeout} s")


def _request(
    port: int, method: str, path: str, body: dict[str, Any] | None, key: str | None
) -> tuple[int, bytes]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        headers = {"Content-Type": "application/json"}
        if key is not None:
            headers["Authorization"] = f"Bearer {key}"
        payload = None if body is None else json.dumps(body).encode()
        connection.request(method, path, body=payload, headers=headers)
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


@contextmanager
def _emulator() -> Iterator[str]:
    """`emulate-sglang` in a process of its own, at a thousandth of the cost model's time."""
    port = _free_port()
    command = [sys.executable, "-m", "inference_auctions.server.cli", "emulate-sglang"]
    command += ["--port", str(port), "--time-scale", "0.001"]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_healthy(port)
        yield f"http://127.0.0.1:{port}"
    finally:
        process.terminate()
        process.wait(30)


@contextmanager
def _server(settings: ServerSettings) -> Iterator[int]:
    """The auction server under uvicorn in a thread of this process, drained at the end."""
    app = create_app(settings)
    config = uvicorn_config(
        app, settings, host="127.0.0.1", port=settings.port, log_level="warning", lifespan="on"
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 60
        while not server.started:
            if not thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the auction server did not start (its log says why)")
            time.sleep(0.01)
        yield settings.port
    finally:
        server.should_exit = True
        thread.join(60)


def _generate(port: int, key: str, index: int) -> None:
    body = {
        "text": f"Request {index}: tell me about radix trees.",
        "sampling_params": {"max_new_tokens": 8},
        "bid": BID_MICROS / 1_000_000,
        "rid": f"walk-{index}",
    }
    status, answer = _request(port, "POST", "/generate", body, key)
    if status != 200:
        raise RuntimeError(f"/generate answered {status}: {answer[:300]!r}")


def trace_one_request(
    database_url: str | None = None, grouped: Mapping[str, str] | None = None
) -> Walk:
    """Run the server, warm it up, and trace one `/generate` from send to answer read
    (`grouped`: see `WalkTracer`)."""
    return trace_walk_and_handoffs(database_url, grouped)[0]


def trace_walk_and_handoffs(
    database_url: str | None = None, grouped: Mapping[str, str] | None = None
) -> tuple[Walk, Handoffs]:
    """`trace_one_request`'s walk, and the request's hand-offs."""
    tracer = WalkTracer(grouped)
    with ExitStack() as stack:
        if database_url is None:
            folder = stack.enter_context(tempfile.TemporaryDirectory())
            database_url = f"sqlite:///{Path(folder) / 'walk.db'}"
        upgrade_schema(database_url)
        with Ledger.from_url(database_url) as ledger:
            key = ledger.create_user(f"walker-{os.getpid()}", budget_micros=10**9).api_key
        engine_url = stack.enter_context(_emulator())
        settings = ServerSettings(
            database_url=database_url,
            engine_url=engine_url,
            port=_free_port(),
            run_jobs=False,
            tokenizer="engine",
        )
        tracer.install()
        stack.callback(tracer.uninstall)
        port = stack.enter_context(_server(settings))
        for index in range(WARM_UP_REQUESTS):
            _generate(port, key, index)
        with tracer.recording():
            _generate(port, key, WARM_UP_REQUESTS)
        return tracer.walk(), tracer.handoffs()


def _print_handoffs(handoffs: Handoffs) -> None:
    console = Console()
    table = Table(title="Hand-offs of one POST /generate")
    for name in handoffs.figures():
        table.add_column(name, justify="right")
    table.add_row(*(str(value) for value in handoffs.figures().values()))
    console.print(table)
    created = Table(title="Tasks created (the coroutine each runs)")
    created.add_column("coroutine")
    created.add_column("tasks", justify="right")
    for name in sorted(set(handoffs.tasks_created)):
        created.add_row(name, str(handoffs.tasks_created.count(name)))
    console.print(created)
    steps = Table(title="Steps per task that ran (suspensions + 1)")
    steps.add_column("task")
    steps.add_column("steps", justify="right")
    for name, count in sorted(handoffs.task_steps.items(), key=lambda item: -item[1]):
        steps.add_row(name, str(count))
    console.print(steps)
    trips = Table(title="Jobs handed to other threads")
    trips.add_column("way")
    trips.add_column("jobs", justify="right")
    for name, count in handoffs.thread_trips.items():
        trips.add_row(name, str(count))
    console.print(trips)


def _print(walk: Walk, *, show_steps: bool) -> None:
    console = Console()
    table = Table(title="One POST /generate through the server (engine in its own process)")
    for column in ("modules", "functions", "calls", "crossings", "returns", "threads"):
        table.add_column(column, justify="right")
    table.add_row(*(f"{value:,}" for value in walk.figures().values()))
    console.print(table)
    modules = Table(title="Calls per module")
    modules.add_column("module")
    modules.add_column("calls", justify="right")
    for module, count in walk.modules.items():
        modules.add_row(module, f"{count:,}")
    console.print(modules)
    if show_steps:
        for thread, before, after in walk.steps:
            console.print(f"[dim]{thread}[/dim] {before} -> {after}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.request_walk",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
    )
    parser.add_argument(
        "--database-url",
        help="the ledger's database (default: a fresh SQLite file); e.g. "
        "postgresql+psycopg://postgres@127.0.0.1:5432/test",
    )
    parser.add_argument("--walk", action="store_true", help="print every crossing in order")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument(
        "--handoffs",
        action="store_true",
        help="also print the hand-offs: tasks created, each task's steps, trips to threads",
    )
    parser.add_argument(
        "--as",
        dest="grouped",
        action="append",
        default=[],
        metavar="MODULE=OTHER",
        help="count MODULE's calls as OTHER's, to see what merging them would save (repeat; "
        "names without the `inference_auctions.` prefix, e.g. billing.fees=billing.settlement; "
        "a folder takes all its modules: server.engine=server.engine)",
    )
    options = parser.parse_args(argv)
    grouped = {}
    for pair in options.grouped:
        module, equals, other = pair.partition("=")
        if not equals or not module or not other:
            parser.error(f"--as {pair!r}: give MODULE=OTHER, e.g. billing.fees=billing.settlement")
        grouped[module] = other
    walk, handoffs = trace_walk_and_handoffs(options.database_url, grouped)
    if options.json:
        figures: dict[str, Any] = {**walk.figures(), "per_module": walk.modules}
        if options.handoffs:
            figures["handoffs"] = {
                **handoffs.figures(),
                "tasks_created": handoffs.tasks_created,
                "task_steps": handoffs.task_steps,
                "thread_trips": handoffs.thread_trips,
            }
        print(json.dumps(figures, indent=2))
        return
    _print(walk, show_steps=options.walk)
    if options.handoffs:
        _print_handoffs(handoffs)


if __name__ == "__main__":
    main()
