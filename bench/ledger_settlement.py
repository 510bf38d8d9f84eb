"""What settling a batch costs the ledger: CPU per settled request, by batch size.

Settles batches of 1, 16, 64 and 256 requests over U users on a fresh ledger for each backend,
from one thread, through `Ledger.settle_claimable` with a trivial clearing (each request pays
half its bid, in positions of arrival), as the server's clearing path does. The holds are
placed beforehand and not timed. CPU is this process's time (`time.process_time`), so on
PostgreSQL the server's own work is not in it.

Run: `python -m bench.ledger_settlement` (see --help); `--profile` prints the top of a
cProfile (by CPU time) of the timed settlements before the table.

Measured on the 2-core development machine (shared, so figures move by 10-20% between
runs; two or three runs each), CPU µs per settled request, 8 users, before and after
settlement moved from the ORM to Core statements on plain rows (then `billing.account_rows`,
now `billing.postings.Account`):

| batch | SQLite before | SQLite after | PostgreSQL before | PostgreSQL after |
|---:|---:|---:|---:|---:|
| 1 | 2,850-2,920 | 930-1,350 | 6,080-6,570 | 1,990-2,730 |
| 16 | 450-530 | 160-240 | 1,000-1,050 | 330-370 |
| 64 | 200 | 90-110 | 325-330 | 155-160 |
| 256 | 160-200 | 67-110 | 250 | 95-105 |

Then with the statements sent to the database driver directly (`billing.driver_sql`; one
run, the machine quiet):

| batch | SQLite | PostgreSQL |
|---:|---:|---:|
| 1 | 416 | 766 |
| 16 | 87 | 96 |
| 64 | 45 | 46 |
| 256 | 33 | 34 |
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from itertools import count

from rich.console import Console
from rich.table import Table

from bench.ledger_group_commit import add_backend_options, scratch_database
from inference_auctions.billing import HoldInput, Ledger
from inference_auctions.billing.inputs import BatchInput, RequestInput

BATCHES = (1, 16, 64, 256)
BID_MICROS = 1_000


@dataclass
class Row:
    """One backend and batch size."""

    backend: str
    batch: int
    requests: int
    seconds: float
    cpu_seconds: float


class _Clearing:
    """A clearing with no auction in it: every request pays half its bid."""

    def __init__(self, users: Mapping[str, str], prefix: str = "batch") -> None:
        self.users = users
        self.prefix = prefix  # of the batch ids, with a counter
        self.batch_ids = count()

    def __call__(
        self, rids: list[str]
    ) -> tuple[BatchInput, Sequence[RequestInput], Mapping[str, int]]:
        requests = [
            RequestInput(
                rid=rid,
                user=self.users[rid],
                position=position,
                priority=1.0 - position / len(rids),
                bid_micros=BID_MICROS,
                prompt_tokens=16,
                arrival=position,
                tree_path=[0, position],
            )
            for position, rid in enumerate(rids)
        ]
        charges: dict[str, int] = {}
        for request in requests:
            charges[request.user] = charges.get(request.user, 0) + BID_MICROS // 2
        batch = BatchInput(
            batch_id=f"{self.prefix}-{next(self.batch_ids)}",
            closed_at=datetime.now(UTC),
            n=len(requests),
            revenue_micros=sum(charges.values()),
            welfare_micros=len(requests) * BID_MICROS,
        )
        return batch, requests, charges


def _settle_all(ledger: Ledger, clearing: _Clearing, batches: list[list[tuple[str, str]]]) -> None:
    for candidates in batches:
        claimed = ledger.settle_claimable(candidates, clearing)
        assert claimed.settled is not None and not claimed.refused, claimed


def measure(backend: str, size: int, args: argparse.Namespace) -> tuple[Row, pstats.Stats | None]:
    """Settle about `args.n` requests in batches of `size` on a fresh database."""
    batches_count = max(args.n // size, 4)
    warm = 2
    total = (batches_count + warm) * size
    with scratch_database(backend, args.postgres_url) as url:
        ledger = Ledger.from_url(url)
        try:
            names = [f"user{k}" for k in range(args.users)]
            for name in names:
                ledger.create_user(name, budget_micros=10**12)
            requests = [
                HoldInput(names[k % len(names)], f"rid-{k}", BID_MICROS) for k in range(total)
            ]
            for start in range(0, total, 256):
                ledger.place_holds(requests[start : start + 256])
            clearing = _Clearing({r.rid: r.user for r in requests})
            candidates = [(r.rid, r.user) for r in requests]
            batches = [candidates[k : k + size] for k in range(0, total, size)]
            _settle_all(ledger, clearing, batches[:warm])  # the pool and the statement caches
            timed = batches[warm:]
            profile = cProfile.Profile(time.process_time) if args.profile else None
            wall, cpu = time.perf_counter(), time.process_time()
            if profile is not None:
                profile.enable()
            _settle_all(ledger, clearing, timed)
            if profile is not None:
                profile.disable()
            seconds, cpu_seconds = time.perf_counter() - wall, time.process_time() - cpu
            assert ledger.reconcile().ok
        finally:
            ledger.close()
    stats = None if profile is None else pstats.Stats(profile)
    return Row(backend, size, len(timed) * size, seconds, cpu_seconds), stats


def main(argv: list[str] | None = None) -> None:
    """Measure every backend and batch size and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=2_048, help="requests per batch size (2,048)")
    parser.add_argument("--users", type=int, default=8, help="users the requests belong to (8)")
    add_backend_options(parser)
    parser.add_argument("--batches", default=",".join(map(str, BATCHES)), help="batch sizes")
    parser.add_argument("--profile", action="store_true", help="print a cProfile per run")
    args = parser.parse_args(argv)
    table = Table(title=f"Settling {args.n} requests of {args.users} users, one thread")
    for column in ("backend", "batch", "requests", "CPU µs/request", "wall µs/request"):
        table.add_column(column, justify="left" if column == "backend" else "right")
    for backend in args.backends.split(","):
        for size in (int(k) for k in args.batches.split(",")):
            row, stats = measure(backend, size, args)
            if stats is not None:
                print(f"--- {backend}, batches of {size}")
                stats.sort_stats("cumulative").print_stats(40)
            table.add_row(
                row.backend,
                str(row.batch),
                str(row.requests),
                f"{row.cpu_seconds / row.requests * 1e6:,.0f}",
                f"{row.seconds / row.requests * 1e6:,.0f}",
            )
    Console().print(table)


if __name__ == "__main__":
    main()
