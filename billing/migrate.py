"""Apply, undo and check the Alembic migrations of the ledger schema from Python.

The Alembic configuration is the `alembic.ini` shipped inside the installed `migrations`
package, so this works from any working directory. That package is found, never imported: its
`env.py` imports billing, not the other way round. Each helper takes a URL (None: the one in
`LedgerSettings`) or an Engine; an Engine is used as is, which lets tests migrate into a
PostgreSQL schema chosen by the engine's `search_path`.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.config import Config
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine
from sqlalchemy.exc import OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout

from inference_auctions.billing.database import create_ledger_engine, unavailable
from inference_auctions.billing.models import Base
from inference_auctions.billing.settings import LedgerSettings


def _ini_path() -> Path:
    # find_spec of a top-level package locates it without running its __init__.
    spec = importlib.util.find_spec("inference_auctions.migrations")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the inference_auctions.migrations package is not installed")
    return Path(next(iter(spec.submodule_search_locations))).resolve() / "alembic.ini"


INI_PATH = _ini_path()


def alembic_config() -> Config:
    """The Alembic configuration of the installed migrations."""
    return Config(str(INI_PATH))


@contextmanager
def _engine(target: str | Engine | None) -> Iterator[Engine]:
    # A database that is down or unreadable is the ledger's `LedgerUnavailable` here too.
    try:
        if isinstance(target, Engine):
            yield target
            return
        url = target if target is not None else LedgerSettings().database_url
        engine = create_ledger_engine(url)
        try:
            yield engine
        finally:
            engine.dispose()
    except (OperationalError, PoolTimeout) as error:
        raise unavailable(error) from error


def upgrade(target: str | Engine | None = None, revision: str = "head") -> None:
    """Migrate the database up to `revision`."""
    with _engine(target) as engine, engine.connect() as connection:
        config = alembic_config()
        config.attributes["connection"] = connection
        command.upgrade(config, revision)
        connection.commit()


def downgrade(target: str | Engine | None, revision: str) -> None:
    """Migrate the database down to `revision` (`base` removes every table)."""
    with _engine(target) as engine, engine.connect() as connection:
        config = alembic_config()
        config.attributes["connection"] = connection
        command.downgrade(config, revision)
        connection.commit()


def head_revision() -> str | None:
    """The newest revision of the migrations."""
    return ScriptDirectory.from_config(alembic_config()).get_current_head()


def current_revision(target: str | Engine | None = None) -> str | None:
    """The revision the database is at (None: not migrated)."""
    with _engine(target) as engine, engine.connect() as connection:
        return MigrationContext.configure(connection).get_current_revision()


def schema_drift(target: str | Engine | None = None) -> list[Any]:
    """Differences between the models and the migrated database (empty when they agree)."""
    with _engine(target) as engine, engine.connect() as connection:
        context = MigrationContext.configure(connection, opts={"compare_type": True})
        return list(compare_metadata(context, Base.metadata))


def describe_drift(difference: Any) -> str:
    """One difference `schema_drift` found, in words: what the database lacks or has extra,
    by the names of its tables, columns and indexes (not SQLAlchemy's reprs)."""
    if isinstance(difference, list):  # the modifications of one column come as a list
        return "; ".join(describe_drift(item) for item in difference)
    kind, *rest = difference
    if kind in ("add_table", "remove_table"):
        where = "missing from the database" if kind == "add_table" else "not in the models"
        return f"table {rest[0].name} is {where}"
    if kind in ("add_index", "remove_index"):
        index = rest[0]
        columns = ", ".join(column.name for column in index.columns)
        where = "missing from the database" if kind == "add_index" else "not in the models"
        return f"index {index.name} on {index.table.name}({columns}) is {where}"
    if kind in ("add_column", "remove_column"):
        _, table, column = rest
        where = "missing from the database" if kind == "add_column" else "not in the models"
        return f"column {table}.{column.name} is {where}"
    if kind.startswith("modify_"):
        _, table, column, _, before, after = rest
        what = kind.removeprefix("modify_")
        return f"column {table}.{column}: {what} is {before} in the database, {after} in the models"
    name = getattr(rest[0], "name", None) if rest else None
    return f"{kind.replace('_', ' ')} {name or ''}".strip()
