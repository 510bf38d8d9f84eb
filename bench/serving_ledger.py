"""The serving benchmark's ledger: a fresh database, the users, and the audit after the runs.

SQLite is a file in the run's temporary folder. PostgreSQL is a database of its own, created
on the server named by `--postgres-url` (default: the test server on 127.0.0.1:5432) and
dropped at the end, so nothing of an earlier run is counted.
"""

from __future__ import annotations

import argparse
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import psycopg
from sqlalchemy import create_engine, func, select
from sqlalchemy.engine import make_url

from bench.ledger_group_commit import DEFAULT_POSTGRES_URL
from inference_auctions.billing import Ledger, migrate
from inference_auctions.billing.models import (
    BatchRequest,
    EntryKind,
    Hold,
    HoldState,
    LedgerEntry,
    RequestStatus,
)

BUDGET_MICROS = 10**15  # a billion credits each: no run comes near it


@dataclass(frozen=True)
class Users:
    """The API keys of the bidding users, and an admin's for `/v1/admin/timings`."""

    keys: list[str]
    admin_key: str


def add_postgres_option(parser: argparse.ArgumentParser) -> None:
    """`--postgres-url`: where a serving benchmark creates its scratch PostgreSQL databases."""
    parser.add_argument(
        "--postgres-url",
        default=DEFAULT_POSTGRES_URL,
        help="a PostgreSQL server on which scratch databases are created and dropped",
    )


@contextmanager
def fresh_database(kind: str, folder: Path, postgres_url: str) -> Iterator[str]:
    """A migrated, empty ledger database of `kind` (sqlite or postgresql); yields its URL."""
    with empty_database(kind, folder, postgres_url) as url:
        migrate.upgrade(url)
        yield url


@contextmanager
def empty_database(
    kind: str, folder: Path, postgres_url: str, name: str = "ledger"
) -> Iterator[str]:
    """A database of `kind` with no tables yet, for whoever migrates it; yields its URL. SQLite:
    `folder/<name>.db`; PostgreSQL: a scratch database, dropped afterwards."""
    if kind == "sqlite":
        yield f"sqlite:///{folder / f'{name}.db'}"
        return
    server = make_url(postgres_url)
    database = f"bench_serving_{secrets.token_hex(4)}"
    admin = server.set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(admin, autocommit=True) as connection:
        connection.execute(f'CREATE DATABASE "{database}"')
    try:
        yield server.set(database=database).render_as_string(hide_password=False)
    finally:
        with psycopg.connect(admin, autocommit=True) as connection:
            connection.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')


def create_users(url: str, count: int) -> Users:
    """`count` bidding users with `BUDGET_MICROS` each, and one admin."""
    with Ledger.from_url(url) as ledger:
        keys = [
            ledger.create_user(f"bench{u}", budget_micros=BUDGET_MICROS).api_key
            for u in range(count)
        ]
        admin = ledger.create_user("bench-admin", budget_micros=0, admin=True).api_key
    return Users(keys, admin)


@dataclass(frozen=True)
class Audit:
    """The ledger after the runs."""

    reconciled: bool
    drifts: int
    served: int
    failed: int
    scheduled: int
    open_holds: int
    charged_micros: int
    refunded_micros: int
    # (user, batch) pairs charged more than the user's bids in that batch: VCG never does.
    overcharged: int

    @property
    def clean(self) -> bool:
        """Reconciled, nothing left open or unresolved, nobody charged above their bids."""
        return (
            self.reconciled and not self.open_holds and not self.scheduled and not self.overcharged
        )


def audit(url: str) -> Audit:
    """Reconcile the ledger and count what it holds."""
    with Ledger.from_url(url) as ledger:
        report = ledger.reconcile()
    engine = create_engine(url)
    try:
        with engine.connect() as db:
            statuses = dict(
                db.execute(
                    select(BatchRequest.status, func.count()).group_by(BatchRequest.status)
                ).all()
            )
            open_holds = db.scalar(
                select(func.count()).select_from(Hold).where(Hold.state == HoldState.OPEN)
            )
            sums = dict(
                db.execute(
                    select(LedgerEntry.kind, func.sum(LedgerEntry.amount_micros))
                    .where(LedgerEntry.kind.in_([EntryKind.CHARGE, EntryKind.REFUND]))
                    .group_by(LedgerEntry.kind)
                ).all()
            )
            charges = (
                select(
                    LedgerEntry.user_id,
                    LedgerEntry.batch_id,
                    (-func.sum(LedgerEntry.amount_micros)).label("charged"),
                )
                .where(LedgerEntry.kind == EntryKind.CHARGE)
                .group_by(LedgerEntry.user_id, LedgerEntry.batch_id)
                .subquery()
            )
            bids = (
                select(
                    BatchRequest.user_id,
                    BatchRequest.batch_id,
                    func.sum(BatchRequest.bid_micros).label("bids"),
                )
                .group_by(BatchRequest.user_id, BatchRequest.batch_id)
                .subquery()
            )
            overcharged = db.scalar(
                select(func.count())
                .select_from(charges)
                .outerjoin(
                    bids,
                    (bids.c.user_id == charges.c.user_id) & (bids.c.batch_id == charges.c.batch_id),
                )
                .where((bids.c.bids.is_(None)) | (charges.c.charged > bids.c.bids))
            )
    finally:
        engine.dispose()
    return Audit(
        reconciled=report.ok,
        drifts=len(report.drifts),
        served=int(statuses.get(RequestStatus.SERVED, 0)),
        failed=int(statuses.get(RequestStatus.FAILED, 0)),
        scheduled=int(statuses.get(RequestStatus.SCHEDULED, 0)),
        open_holds=int(open_holds or 0),
        charged_micros=-int(sums.get(EntryKind.CHARGE) or 0),
        refunded_micros=int(sums.get(EntryKind.REFUND) or 0),
        overcharged=int(overcharged or 0),
    )
