"""What the order of rids costs the ledger as it grows: random rids against time-ordered ones.

The ledger keys rows by rid: a hold's primary key, its `hold:<rid>` idempotency key, the
request's record. A random rid (a UUID4) lands on a random leaf page of each of those indexes,
so a group commit of k requests dirties about k pages per index, and once the ledger is larger
than the database's cache it reads them first. A time-ordered rid (`new_rid`: a millisecond
clock, then random bits) lands at the right edge, where the last commit already was.

Per backend: two fresh ledgers, one per order, 8 users each, then `--holds` holds placed in
each through `Ledger.place_holds` in groups of `--group` (6 is a batch at 20 connections), from
one thread, the two ledgers taking turns group by group, so that the machine's drift falls on
both alike. Every `--every` holds it reports, per order, the CPU (`time.process_time`, so on
PostgreSQL the server's own work is not in it) and the wall time per group since the last mark,
and the ratio of ordered to random. Every 3,000 holds it runs, untimed, an `ANALYZE` on
PostgreSQL, what autovacuum would do as the tables grow, so that the plans are the ones a
server would have even where autovacuum is off.

Run: `python -m bench.ledger_rid_order` (see --help); a few minutes per backend.
"""

from __future__ import annotations

import argparse
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field

from rich.console import Console
from rich.progress import Progress
from rich.table import Table
from sqlalchemy import text

from bench.ledger_group_commit import add_backend_options, scratch_database
from inference_auctions.billing import HoldInput, HoldView, Ledger
from inference_auctions.server.api.generation import new_rid

# About what autovacuum's analyze threshold lets a ledger of this size grow between two runs.
STATISTICS_EVERY = 3_000

ORDERS: dict[str, Callable[[], str]] = {
    "random": lambda: uuid.uuid4().hex,
    "ordered": new_rid,
}


@dataclass
class Side:
    """One order's ledger and the time its groups took since the last mark."""

    name: str
    rid: Callable[[], str]
    ledger: Ledger
    cpu: float = 0.0
    wall: float = 0.0
    marks: list[tuple[float, float]] = field(default_factory=list)  # µs per group

    def place(self, placed: int, args: argparse.Namespace) -> None:
        group = [
            HoldInput(f"user{(placed + i) % args.users}", self.rid(), 1_000)
            for i in range(args.group)
        ]
        wall, cpu = time.perf_counter(), time.process_time()
        results = self.ledger.place_holds(group)
        self.cpu += time.process_time() - cpu
        self.wall += time.perf_counter() - wall
        refused = [r for r in results if not isinstance(r, HoldView)]
        if refused:  # every user's budget is far above what the run holds
            raise RuntimeError(f"{len(refused)} of {len(group)} holds were refused: {refused[0]!r}")

    def mark(self, groups: int) -> None:
        self.marks.append((self.cpu / groups * 1e6, self.wall / groups * 1e6))
        self.cpu = self.wall = 0.0


@contextmanager
def _sides(backend: str, args: argparse.Namespace) -> Iterator[list[Side]]:
    """A fresh ledger per order, with its users."""
    with ExitStack() as stack:
        sides = []
        for name, rid in ORDERS.items():
            ledger = Ledger.from_url(
                stack.enter_context(scratch_database(backend, args.postgres_url))
            )
            stack.callback(ledger.close)
            for k in range(args.users):
                ledger.create_user(f"user{k}", budget_micros=10**15)
            sides.append(Side(name, rid, ledger))
        yield sides
        for side in sides:
            assert side.ledger.reconcile().ok


def _analyze(ledger: Ledger) -> None:
    """What autovacuum's `ANALYZE` would do as the tables grow (PostgreSQL only)."""
    if ledger.dialect_name == "postgresql":
        with ledger.engine.begin() as connection:
            connection.execute(text("ANALYZE"))


def measure(backend: str, args: argparse.Namespace, progress: Progress) -> list[Side]:
    """Fill both ledgers, a group in each in turn; a mark every `args.every` holds."""
    task = progress.add_task(backend, total=args.holds)
    with _sides(backend, args) as sides:
        placed = groups = 0
        while placed < args.holds:
            for side in sides:
                side.place(placed, args)
            placed += args.group
            groups += 1
            progress.update(task, completed=placed)
            if placed % STATISTICS_EVERY < args.group:
                for side in sides:  # untimed: autovacuum runs it in a process of its own
                    _analyze(side.ledger)
            if placed % args.every == 0:
                for side in sides:
                    side.mark(groups)
                groups = 0
                random, ordered = (side.marks[-1] for side in sides)
                progress.console.print(
                    f"{backend}, {placed:,} holds: CPU µs per group {random[0]:,.0f} random, "
                    f"{ordered[0]:,.0f} ordered"
                )
    progress.remove_task(task)
    return sides


def main(argv: list[str] | None = None) -> None:
    """Measure every backend and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--holds", type=int, default=120_000, help="holds per order (120,000)")
    parser.add_argument("--group", type=int, default=6, help="holds per commit (6)")
    parser.add_argument("--every", type=int, default=30_000, help="holds between marks (30,000)")
    parser.add_argument("--users", type=int, default=8, help="users the holds go to (8)")
    add_backend_options(parser)
    args = parser.parse_args(argv)
    if args.every % args.group or args.holds % args.every:
        parser.error("--every must be a multiple of --group, and --holds a multiple of --every")
    table = Table(title=f"holds in groups of {args.group} for {args.users} users, one thread")
    for column in ("backend", "ledger holds", "rids", "CPU µs/group", "wall µs/group", "ratio"):
        table.add_column(column, justify="left" if column in ("backend", "rids") else "right")
    with Progress(transient=True) as progress:
        for backend in args.backends.split(","):
            random, ordered = measure(backend, args, progress)
            for k, (before, after) in enumerate(zip(random.marks, ordered.marks, strict=True)):
                holds = f"{(k + 1) * args.every:,}"
                table.add_row(
                    backend, holds, "random", f"{before[0]:,.0f}", f"{before[1]:,.0f}", ""
                )
                ratio = f"{after[0] / before[0]:.2f}x / {after[1] / before[1]:.2f}x"
                table.add_row(
                    backend, holds, "ordered", f"{after[0]:,.0f}", f"{after[1]:,.0f}", ratio
                )
    Console().print(table)


if __name__ == "__main__":
    main()
