"""Migrated ledger databases for tests, on SQLite and on PostgreSQL.

Import the fixtures into a `conftest.py` (`from tests.db_fixtures import ledger, ledger_db`):

- `ledger_db`: a `MigratedDatabase`, parametrized over `sqlite` (a fresh file) and `postgres`
  (a fresh schema in the database named by `INFERENCE_AUCTION_TEST_POSTGRES_URL`), built by
  the Alembic migrations and removed afterwards. `db.url` reaches the same schema, so code
  that takes a URL (settings, `Ledger.from_url`) can be pointed at it.
- `ledger`: a `billing.Ledger` on `ledger_db`.

Without a reachable PostgreSQL the `postgres` cases are skipped, with the reason, unless
`INFERENCE_AUCTION_REQUIRE_POSTGRES=1` (set by CI), which makes them fail instead.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import OperationalError

from inference_auctions.billing import Ledger, migrate
from inference_auctions.billing.database import create_ledger_engine

DEFAULT_POSTGRES_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
BACKENDS = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]


def postgres_url() -> str:
    """The PostgreSQL server the tests use (`INFERENCE_AUCTION_TEST_POSTGRES_URL`)."""
    return os.environ.get("INFERENCE_AUCTION_TEST_POSTGRES_URL") or DEFAULT_POSTGRES_URL


@cache
def _postgres_problem() -> str | None:
    # Asked once per test run: a dead server should cost one timeout, not one per test.
    engine = create_ledger_engine(postgres_url(), connect_args={"connect_timeout": 3})
    try:
        with engine.connect() as connection:
            connection.execute(text("SELECT 1"))
    except OperationalError as exc:
        return str(exc.orig).strip().splitlines()[0] if exc.orig else str(exc)
    finally:
        engine.dispose()
    return None


def require_postgres() -> str:
    """The PostgreSQL URL, after skipping (or failing, under CI) when it is unreachable."""
    problem = _postgres_problem()
    if problem is not None:
        url = make_url(postgres_url()).render_as_string(hide_password=True)
        message = (
            f"PostgreSQL not reachable at {url} ({problem}); start it or set"
            " INFERENCE_AUCTION_TEST_POSTGRES_URL"
        )
        if os.environ.get("INFERENCE_AUCTION_REQUIRE_POSTGRES") == "1":
            pytest.fail(message + " (INFERENCE_AUCTION_REQUIRE_POSTGRES=1)", pytrace=False)
        pytest.skip(message)
    return postgres_url()


@dataclass
class MigratedDatabase:
    """A migrated, empty ledger database; engines made by `engine_for` are disposed with it."""

    backend: str
    url: str
    engine: Engine
    _extra: list[Engine] = field(default_factory=list)

    def new_engine(self, **kwargs: Any) -> Engine:
        """Another engine on the same database, as a second replica would have."""
        engine = create_ledger_engine(self.url, **kwargs)
        self._extra.append(engine)
        return engine

    def dispose(self) -> None:
        """Close every connection of every engine made for this database."""
        for engine in [self.engine, *self._extra]:
            engine.dispose()


@contextmanager
def migrated_database(backend: str, tmp_path: Path) -> Iterator[MigratedDatabase]:
    """A fresh ledger database on `backend`, built by the migrations, removed afterwards."""
    if backend == "sqlite":
        url = f"sqlite:///{tmp_path / 'ledger.db'}"
        db = MigratedDatabase(backend, url, create_ledger_engine(url))
        try:
            migrate.upgrade(db.engine)
            yield db
        finally:
            db.dispose()
        return
    with _postgres_schema(require_postgres()) as url:
        db = MigratedDatabase(backend, url, create_ledger_engine(url))
        try:
            migrate.upgrade(db.engine)
            yield db
        finally:
            db.dispose()


@contextmanager
def dml_role(db: MigratedDatabase, prefix: str) -> Iterator[str]:
    """A login role with only what a server needs on `db`'s PostgreSQL schema once it is
    migrated (`SELECT, INSERT, UPDATE, DELETE` on its tables, its sequences), as
    docs/operations/postgresql.md lets a server run; dropped at the end, its sessions ended
    first."""
    role = f"{prefix}_{secrets.token_hex(4)}"
    schema = str(make_url(db.url).query["options"]).split("=", 1)[1]
    with db.engine.begin() as connection:
        connection.execute(text(f"CREATE ROLE {role} LOGIN"))
        connection.execute(text(f"GRANT USAGE ON SCHEMA {schema} TO {role}"))
        connection.execute(
            text(f"GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA {schema} TO {role}")
        )
        connection.execute(
            text(f"GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA {schema} TO {role}")
        )
    try:
        yield role
    finally:
        with db.engine.begin() as connection:
            connection.execute(
                text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = :r"),
                {"r": role},
            )
            connection.execute(text(f"DROP OWNED BY {role}"))
            connection.execute(text(f"DROP ROLE {role}"))


@contextmanager
def _postgres_schema(base_url: str) -> Iterator[str]:
    # A schema per test isolates tests without a database per test; `search_path` in the URL
    # makes every connection (and the migrations) use it.
    schema = f"t_{secrets.token_hex(6)}"
    admin = create_ledger_engine(base_url)
    try:
        with admin.begin() as connection:
            connection.execute(text(f"CREATE SCHEMA {schema}"))
        url = make_url(base_url).update_query_dict({"options": f"-csearch_path={schema}"})
        try:
            yield url.render_as_string(hide_password=False)
        finally:
            with admin.begin() as connection:
                connection.execute(text(f"DROP SCHEMA {schema} CASCADE"))
    finally:
        admin.dispose()


@pytest.fixture(params=BACKENDS)
def ledger_db(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[MigratedDatabase]:
    """A migrated, empty ledger database on each backend."""
    with migrated_database(request.param, tmp_path) as db:
        yield db


@pytest.fixture
def ledger(ledger_db: MigratedDatabase) -> Ledger:
    """A `Ledger` on the test's database."""
    return Ledger(ledger_db.engine)
