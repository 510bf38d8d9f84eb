"""What group commit saves the ledger: holds per second and CPU per hold, by group size.

Places N holds for U users on a fresh ledger for each mode and backend, from one thread:
"group of k" is `Ledger.place_holds` with k holds per transaction (k = 1 is `Ledger.place_hold`).
The ORM path that placed every hold before group commit (`billing.holds.place_hold`, measured
here as "per hold" until 2026-12-04: 2,737 CPU µs a hold on SQLite, 5,478 on PostgreSQL, against
597 and 1,729 for a group of 1) is gone: every hold goes through `billing.holds`. CPU is
this process's time (`time.process_time`), so on PostgreSQL the server's own work is not in it.

Run: `python -m bench.ledger_group_commit` (see --help).
"""

from __future__ import annotations

import argparse
import os
import secrets
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table
from sqlalchemy import text
from sqlalchemy.engine import make_url

from inference_auctions.billing import HoldInput, Ledger, upgrade_schema
from inference_auctions.billing.database import create_ledger_engine

DEFAULT_POSTGRES_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
GROUPS = (1, 16, 64, 256)


@dataclass
class Row:
    """One backend and mode."""

    backend: str
    mode: str
    holds: int
    seconds: float
    cpu_seconds: float


@contextmanager
def scratch_database(backend: str, postgres_url: str) -> Iterator[str]:
    """A fresh, migrated ledger database; removed afterwards."""
    if backend == "sqlite":
        with tempfile.TemporaryDirectory() as folder:
            url = f"sqlite:///{Path(folder) / 'ledger.db'}"
            engine = create_ledger_engine(url)
            upgrade_schema(engine)
            engine.dispose()
            yield url
        return
    schema = f"bench_{secrets.token_hex(4)}"
    admin = create_ledger_engine(postgres_url)
    try:
        with admin.begin() as connection:
            connection.execute(text(f"CREATE SCHEMA {schema}"))
        url = (
            make_url(postgres_url)
            .update_query_dict({"options": f"-csearch_path={schema}"})
            .render_as_string(hide_password=False)
        )
        engine = create_ledger_engine(url)
        upgrade_schema(engine)
        engine.dispose()
        yield url
    finally:
        with admin.begin() as connection:
            connection.execute(text(f"DROP SCHEMA IF EXISTS {schema} CASCADE"))
        admin.dispose()


def add_backend_options(parser: argparse.ArgumentParser) -> None:
    """`--postgres-url` and `--backends`, as every ledger benchmark takes them."""
    parser.add_argument(
        "--postgres-url",
        default=os.environ.get("INFERENCE_AUCTION_TEST_POSTGRES_URL", DEFAULT_POSTGRES_URL),
        help="a PostgreSQL database to create a scratch schema in",
    )
    parser.add_argument("--backends", default="sqlite,postgres", help="sqlite,postgres")


def _requests(n: int, users: int) -> list[HoldInput]:
    return [HoldInput(f"user{k % users}", f"rid-{k}", 1_000) for k in range(n)]


def _grouped(ledger: Ledger, size: int) -> Callable[[list[HoldInput]], None]:
    def place(requests: list[HoldInput]) -> None:
        for start in range(0, len(requests), size):
            results = ledger.place_holds(requests[start : start + size])
            assert all(type(r).__name__ == "HoldView" for r in results), results

    return place


def measure(backend: str, mode: str, size: int, args: argparse.Namespace) -> Row:
    """Place `args.n` holds in one mode on a fresh database."""
    with scratch_database(backend, args.postgres_url) as url:
        ledger = Ledger.from_url(url)
        try:
            for k in range(args.users):
                ledger.create_user(f"user{k}", budget_micros=10**12)
            requests = _requests(args.n, args.users)
            place = _grouped(ledger, size)
            place(requests[: min(50, args.n)])  # warm the pool and the statement caches
            rest = requests[min(50, args.n) :]
            wall, cpu = time.perf_counter(), time.process_time()
            place(rest)
            seconds, cpu_seconds = time.perf_counter() - wall, time.process_time() - cpu
            assert ledger.reconcile().ok
        finally:
            ledger.close()
    return Row(backend, mode, len(rest), seconds, cpu_seconds)


def main(argv: list[str] | None = None) -> None:
    """Measure every backend and mode and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=2_000, help="holds per mode (2,000)")
    parser.add_argument("--users", type=int, default=8, help="users the holds go to (8)")
    add_backend_options(parser)
    args = parser.parse_args(argv)
    modes = [(f"group of {k}", k) for k in GROUPS]
    table = Table(title=f"{args.n} holds for {args.users} users, one thread")
    for column in ("backend", "mode", "holds/s", "CPU µs/hold", "wall µs/hold"):
        table.add_column(column, justify="left" if column in ("backend", "mode") else "right")
    for backend in args.backends.split(","):
        for mode, size in modes:
            row = measure(backend, mode, size, args)
            table.add_row(
                row.backend,
                row.mode,
                f"{row.holds / row.seconds:,.0f}",
                f"{row.cpu_seconds / row.holds * 1e6:,.0f}",
                f"{row.seconds / row.holds * 1e6:,.0f}",
            )
    Console().print(table)


if __name__ == "__main__":
    main()
