"""What the order of rids costs the ledger as it grows: random rids against time-ordered ones.

The ledger keys rows by rid: a hold's primary key, its `hold:<rid>` idempotency key, the
request's record. A random rid (a UUID4) lands on a random leaf page of each of those indexes,
so a group commit of k requests dirties about k pages per index, and once the ledger is larger
than the database's cache it reads them first. A time-ordered rid (`new_rid`: a millisecond
clock, then random bits) lands at the right edge, where the last commit already was.

For each backend and order: a fresh ledger, 8 users, then `--holds` holds placed through
`Ledger.place_holds` in groups of `--group` (6 is a batch at 20 connections), from one
thread. Every `--every` holds it reports the CPU (`time.process_time`, so on PostgreSQL the
server's own work is not in it) and the wall time per group over the holds since the last
mark, and the ratio of time-ordered to random at the same ledger size. Every 3,000 holds it
runs, untimed, what the server's statistics job would (`billing.table_statistics`: on a
PostgreSQL server whose autovacuum is off, an `ANALYZE` of the tables that grew), so that the
plans are the ones a server would have.

Run: `python -m bench.ledger_rid_order` (see --help); about a minute per backend and order.
"""

from __future__ import annotations

import argparse
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from bench.ledger_group_commit import add_backend_options, scratch_database
from inference_auctions.billing import HoldRequest, Ledger
from inference_auctions.billing.table_statistics import analyze_if_autovacuum_off
from inference_auctions.server.api.generation import new_rid

# About what the server's statistics job finds between two of its runs, 10 s apart, at a few
# hundred requests a second; it does anything only on PostgreSQL with autovacuum off.
STATISTICS_EVERY = 3_000

ORDERS: dict[str, Callable[[], str]] = {
    "random": lambda: uuid.uuid4().hex,
    "ordered": new_rid,
}


@dataclass(frozen=True)
class Mark:
    """The groups placed between two ledger sizes."""

    holds: int
    cpu_us_per_group: float
    wall_us_per_group: float


def measure(
    backend: str,
    label: str,
    rid: Callable[[], str],
    args: argparse.Namespace,
    progress: Progress,
) -> list[Mark]:
    """Fill a fresh ledger with `args.holds` holds, a group at a time; one mark per `args.every`."""
    marks: list[Mark] = []
    task = progress.add_task(f"{backend}, {label} rids", total=args.holds)
    with scratch_database(backend, args.postgres_url) as url:
        ledger = Ledger.from_url(url)
        try:
            for k in range(args.users):
                ledger.create_user(f"user{k}", budget_micros=10**15)
            placed = groups = 0
            wall, cpu = time.perf_counter(), time.process_time()
            while placed < args.holds:
                group = [
                    HoldRequest(f"user{(placed + i) % args.users}", rid(), 1_000)
                    for i in range(args.group)
                ]
                results = ledger.place_holds(group)
                assert all(type(r).__name__ == "HoldView" for r in results), results
                placed += args.group
                groups += 1
                progress.update(task, completed=placed)
                if placed % STATISTICS_EVERY < args.group:
                    # The server's statistics job, untimed: it runs on a thread of its own.
                    paused_wall, paused_cpu = time.perf_counter(), time.process_time()
                    analyze_if_autovacuum_off(ledger.engine)
                    wall += time.perf_counter() - paused_wall
                    cpu += time.process_time() - paused_cpu
                if placed % args.every == 0:
                    now_wall, now_cpu = time.perf_counter(), time.process_time()
                    mark = Mark(
                        placed, (now_cpu - cpu) / groups * 1e6, (now_wall - wall) / groups * 1e6
                    )
                    marks.append(mark)
                    progress.console.print(
                        f"{backend}, {label} rids, {placed:,} holds: "
                        f"{mark.cpu_us_per_group:,.0f} µs of CPU per group"
                    )
                    wall, cpu, groups = now_wall, now_cpu, 0
            assert ledger.reconcile().ok
        finally:
            ledger.close()
    progress.remove_task(task)
    return marks


def main(argv: list[str] | None = None) -> None:
    """Measure every backend and order and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--holds", type=int, default=120_000, help="holds per run (120,000)")
    parser.add_argument("--group", type=int, default=6, help="holds per commit (6)")
    parser.add_argument("--every", type=int, default=30_000, help="holds between marks (30,000)")
    parser.add_argument("--users", type=int, default=8, help="users the holds go to (8)")
    add_backend_options(parser)
    args = parser.parse_args(argv)
    if args.every % args.group or args.holds % args.every:
        parser.error("--every must be a multiple of --group, and --holds a multiple of --every")
    table = Table(title=f"holds in groups of {args.group} for {args.users} users, one thread")
    for column in (
        "backend",
        "ledger holds",
        "rids",
        "CPU µs/group",
        "wall µs/group",
        "CPU ratio",
        "wall ratio",
    ):
        table.add_column(column, justify="left" if column in ("backend", "rids") else "right")
    with Progress(transient=True) as progress:
        for backend in args.backends.split(","):
            results = {
                name: measure(backend, name, rid, args, progress) for name, rid in ORDERS.items()
            }
            random, ordered = results.values()
            for before, after in zip(random, ordered, strict=True):
                for name, mark in zip(ORDERS, (before, after), strict=True):
                    is_ordered = mark is after
                    table.add_row(
                        backend,
                        f"{mark.holds:,}",
                        name,
                        f"{mark.cpu_us_per_group:,.0f}",
                        f"{mark.wall_us_per_group:,.0f}",
                        f"{after.cpu_us_per_group / before.cpu_us_per_group:.2f}x"
                        if is_ordered
                        else "",
                        f"{after.wall_us_per_group / before.wall_us_per_group:.2f}x"
                        if is_ordered
                        else "",
                    )
    Console().print(table)


if __name__ == "__main__":
    main()
