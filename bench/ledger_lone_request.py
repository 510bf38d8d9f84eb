"""What a lone request costs the ledger: its two group commits, in time, CPU and round trips.

A request that meets no other costs two transactions of the server's ledger writer
(`Ledger.commit_group`): one places its hold and settles its batch of one, the other records
it served before its last byte. This runs that pair `--n` times on a fresh ledger per backend,
from one thread, with a trivial clearing (`bench.ledger_settlement`), and reports per commit
the median and 90th percentile of its wall time, its CPU (the committing thread's, so not
PostgreSQL's own), and on PostgreSQL its round trips to the server, counted in a separate pass
through a relay that reads the protocol (`bench.round_trips`; the relay's own delay stays out
of the timed pass).

`--beside idle|half|busy` runs the commits on a thread of their own, as the server's ledger
thread runs them beside its event loop, while the main thread does nothing, runs Python half
the time or runs it throughout: what sharing the interpreter's lock costs the commits.

Run: `python -m bench.ledger_lone_request` (see --help). To compare with an earlier version of
the ledger, run this file from this checkout with `PYTHONPATH` set to the other checkout: it
only uses `Ledger.commit_group` and the records it takes.
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
from dataclasses import dataclass

from rich.console import Console
from rich.table import Table

from bench.ledger_group_commit import DEFAULT_POSTGRES_URL, scratch_database
from bench.ledger_settlement import BID_MICROS, _Clearing
from bench.round_trips import RoundTrips
from inference_auctions.billing import (
    BatchClaim,
    HoldInput,
    Ledger,
    ServedInput,
)
from inference_auctions.billing.database import create_ledger_engine

USER = "lone"


@dataclass
class Row:
    """One backend and one of the two commits."""

    backend: str
    commit: str
    wall_ms: list[float]
    cpu_us: float
    round_trips: float | None


class _LoneRequests:
    """Lone requests on one ledger: each one's two commits, timed by the caller."""

    def __init__(self, ledger: Ledger, prefix: str) -> None:
        self.ledger = ledger
        self.prefix = prefix
        self.count = 0
        self.users: dict[str, str] = {}  # rid -> user, for the clearing
        self.clearing = _Clearing(self.users, prefix)

    def settle(self) -> str:
        """Place a new request's hold and settle it alone, in one commit; its rid."""
        self.count += 1
        rid = f"{self.prefix}-{self.count}"
        self.users[rid] = USER
        outcome = self.ledger.commit_group(
            [HoldInput(USER, rid, BID_MICROS)], [], [BatchClaim([(rid, USER)], self.clearing)]
        )
        [claimed] = outcome.claimed
        assert not isinstance(claimed, Exception) and claimed.settled is not None, claimed
        return rid

    def serve(self, rid: str) -> None:
        """Record the request served, in one commit."""
        assert self.ledger.commit_group([], [ServedInput(rid, None, 1.0)], []).served == [True]


Timing = tuple[float, float]  # wall seconds, CPU seconds


def _pairs(lone: _LoneRequests, n: int) -> list[tuple[Timing, Timing]]:
    """The timings of both commits of `n` lone requests (CPU: the calling thread's)."""
    timed: list[tuple[Timing, Timing]] = []
    for _ in range(n):
        wall, cpu = time.perf_counter(), time.thread_time()
        rid = lone.settle()
        settled = (time.perf_counter() - wall, time.thread_time() - cpu)
        wall, cpu = time.perf_counter(), time.thread_time()
        lone.serve(rid)
        timed.append((settled, (time.perf_counter() - wall, time.thread_time() - cpu)))
    return timed


# What the main thread does while `--beside` runs the commits on a thread of their own, as the
# server's ledger thread runs them beside its event loop: nothing, Python half the time (bursts
# of 0.2 ms, each followed by 0.2 ms asleep, which lets go of the interpreter's lock, as an
# event loop at half load does), or Python throughout.
BESIDE = ("idle", "half", "busy")


def _pairs_beside(lone: _LoneRequests, n: int, main_thread: str) -> list[tuple[Timing, Timing]]:
    """`_pairs` on a thread of its own, the main thread doing `main_thread` meanwhile."""
    timed: list[tuple[Timing, Timing]] = []
    worker = threading.Thread(target=lambda: timed.extend(_pairs(lone, n)))
    worker.start()
    while main_thread != "idle" and worker.is_alive():
        burst_ends = time.perf_counter() + 0.0002
        while time.perf_counter() < burst_ends:
            pass
        if main_thread == "half":
            time.sleep(0.0002)
    worker.join()
    return timed


def _round_trips(url: str, n: int) -> tuple[float, float]:
    """Round trips per settling and per serving commit, through a counting relay."""
    relay = RoundTrips(url)
    engine = create_ledger_engine(relay.url, pool_size=1, max_overflow=0)
    try:
        lone = _LoneRequests(Ledger(engine), "relayed")
        lone.serve(lone.settle())  # the pooled connection, made outside the count
        settling = serving = 0
        for _ in range(n):
            with relay.counting() as one:
                rid = lone.settle()
            settling += one[0]
            with relay.counting() as two:
                lone.serve(rid)
            serving += two[0]
        return settling / n, serving / n
    finally:
        engine.dispose()
        relay.close()


def measure(backend: str, args: argparse.Namespace) -> list[Row]:
    """Both commits of `args.n` lone requests on a fresh database of `backend`."""
    with scratch_database(backend, args.postgres_url) as url:
        ledger = Ledger.from_url(url)
        try:
            ledger.create_user(USER, budget_micros=10**12)
            lone = _LoneRequests(ledger, "timed")
            _pairs(lone, args.warmup)  # the pool and the statement caches
            if args.beside is None:
                timed = _pairs(lone, args.n)
            else:
                timed = _pairs_beside(lone, args.n, args.beside)
            assert ledger.reconcile().ok
        finally:
            ledger.close()
        trips = _round_trips(url, 20) if backend == "postgres" else (None, None)
    rows = []
    for index, name in enumerate(("hold + settlement", "served record")):
        walls = [pair[index][0] * 1000 for pair in timed]
        cpu = statistics.fmean(pair[index][1] for pair in timed) * 1e6
        rows.append(Row(backend, name, walls, cpu, trips[index]))
    return rows


def main(argv: list[str] | None = None) -> None:
    """Measure and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=1_000, help="lone requests timed (1,000)")
    parser.add_argument("--warmup", type=int, default=100, help="lone requests first (100)")
    parser.add_argument(
        "--postgres-url", default=DEFAULT_POSTGRES_URL, help="a PostgreSQL server to use"
    )
    parser.add_argument("--backends", default="sqlite,postgres", help="sqlite,postgres")
    parser.add_argument(
        "--beside",
        choices=BESIDE,
        help="run the commits on a thread of their own, the main thread meanwhile idle, "
        "running Python half the time (like an event loop at half load) or all the time: "
        "what sharing the interpreter's lock costs the server's ledger thread",
    )
    args = parser.parse_args(argv)
    beside = "" if args.beside is None else f", main thread {args.beside}"
    table = Table(title=f"A lone request's two group commits ({args.n:,} requests{beside})")
    for column in ("backend", "commit", "p50 ms", "p90 ms", "CPU µs", "round trips"):
        table.add_column(column, justify="left" if column in ("backend", "commit") else "right")
    console = Console()
    for backend in args.backends.split(","):
        with console.status(f"{backend}: {args.n:,} lone requests"):
            rows = measure(backend, args)
        for row in rows:
            deciles = statistics.quantiles(row.wall_ms, n=10)
            table.add_row(
                row.backend,
                row.commit,
                f"{statistics.median(row.wall_ms):.3f}",
                f"{deciles[-1]:.3f}",
                f"{row.cpu_us:,.0f}",
                "-" if row.round_trips is None else f"{row.round_trips:g}",
            )
    console.print(table)


if __name__ == "__main__":
    main()
