"""What is wrong with a database URL, said before anything is opened or created.

The ledger runs on SQLite and PostgreSQL. A URL that SQLAlchemy cannot parse, another database
(`mysql://`), a driver that is not installed, a SQLite URL with two slashes (`sqlite://x.db`,
which names a host, not a file) or a SQLite file in a folder that does not exist is
`InvalidInput` on `database_url` with one sentence that says what to give instead;
`probe_database` then finds out whether the database answers.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from sqlalchemy import text
from sqlalchemy.engine import URL
from sqlalchemy.exc import ArgumentError, NoSuchModuleError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout

from inference_auctions.billing.database import create_ledger_engine, normalize_url, unavailable
from inference_auctions.billing.errors import InvalidInput

__all__ = ["check_database_url", "probe_database", "sqlite_file"]

FIELD = "database_url"
EXAMPLES = "sqlite:///inference-auction.db or postgresql+psycopg://user@host:5432/dbname"
# The DB-API module each supported driver needs.
_DRIVER_MODULES = {"pysqlite": "sqlite3", "psycopg": "psycopg", "psycopg2": "psycopg2"}


def check_database_url(url: str) -> None:
    """Raise `InvalidInput` unless `url` names a SQLite or PostgreSQL database this process
    has a driver for."""
    parsed = _parse(url)
    backend = parsed.get_backend_name()
    if backend not in ("sqlite", "postgresql"):
        raise InvalidInput(
            FIELD,
            f"{backend} is not supported: the ledger runs on SQLite or PostgreSQL ({EXAMPLES})",
        )
    try:
        driver = parsed.get_driver_name()
        parsed.get_dialect()
    except NoSuchModuleError:
        raise InvalidInput(
            FIELD, f"{parsed.drivername!r} is not a driver of {backend}; use {EXAMPLES}"
        ) from None
    module = _DRIVER_MODULES.get(driver, driver)
    if importlib.util.find_spec(module) is None:
        raise InvalidInput(
            FIELD, f"the {driver} driver is not installed; use postgresql+psycopg:// (installed)"
        )
    if backend == "sqlite":
        _check_sqlite(parsed, url)


def _check_sqlite(parsed: URL, url: str) -> None:
    # SQLAlchemy reads `sqlite://x.db` as a host and refuses it only on connecting, with a
    # traceback; a folder that does not exist fails every command with "unable to open".
    if parsed.host:
        meant = "/".join(part for part in (parsed.host, parsed.database) if part)
        raise InvalidInput(
            FIELD,
            f"{url!r} names a host, not a file: a SQLite URL has three slashes before a "
            f"relative path (sqlite:///{meant}) and four before an absolute one "
            "(sqlite:////var/lib/ledger.db)",
        )
    path = sqlite_file(url)
    if path is not None and not path.parent.is_dir():
        raise InvalidInput(
            FIELD,
            f"the folder {path.parent} of the SQLite file does not exist: create it "
            f"(mkdir -p {path.parent}) or name a file in a folder that exists",
        )


def sqlite_file(url: str) -> Path | None:
    """The file a SQLite URL names; None for another database or SQLite in memory."""
    parsed = _parse(url)
    if parsed.get_backend_name() != "sqlite" or parsed.database in (None, "", ":memory:"):
        return None
    if parsed.database.startswith("file:"):  # a URI filename: only SQLite reads those
        return None
    return Path(parsed.database)


def probe_database(url: str) -> None:
    """Connect once and run `SELECT 1`: `LedgerUnavailable` (with the driver's reason) when
    the database does not answer. A SQLite file that does not exist yet is created."""
    check_database_url(url)
    if _parse(url).get_backend_name() == "postgresql":
        # A host that drops packets would otherwise hold the command for minutes.
        engine = create_ledger_engine(url, connect_args={"connect_timeout": 10})
    else:
        engine = create_ledger_engine(url)
    try:
        with engine.connect() as connection:
            connection.execute(text("SELECT 1"))
    except (OperationalError, PoolTimeout) as error:
        raise unavailable(error) from error
    finally:
        engine.dispose()


def _parse(url: str) -> URL:
    try:
        return normalize_url(url)
    except ArgumentError:
        raise InvalidInput(FIELD, f"{url!r} is not a database URL; use {EXAMPLES}") from None
