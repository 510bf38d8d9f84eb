"""A ledger on PostgreSQL whose autovacuum is off says so in one WARNING line at start-up
(`billing.autovacuum`): for the database server (`SHOW autovacuum`) and for each ledger table
whose own setting turns it off."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import text

from inference_auctions.billing import Ledger
from inference_auctions.billing.autovacuum import SERVER, autovacuum_gaps, warning_line
from tests.db_fixtures import MigratedDatabase, migrated_database

LOGGER = "inference_auctions.billing.autovacuum"


@pytest.fixture
def postgres_ledger(tmp_path: Path) -> Iterator[MigratedDatabase]:
    with migrated_database("postgres", tmp_path) as db:
        yield db


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER]


@pytest.mark.postgres
def test_the_server_setting_is_read_from_the_database(
    postgres_ledger: MigratedDatabase, caplog: pytest.LogCaptureFixture
) -> None:
    with postgres_ledger.engine.connect() as connection:
        server_on = connection.scalar(text("SHOW autovacuum")) == "on"
        assert autovacuum_gaps(connection) == ([] if server_on else [SERVER])
    caplog.set_level(logging.WARNING, logger=LOGGER)
    assert Ledger(postgres_ledger.engine).warn_if_autovacuum_off() == (
        [] if server_on else [SERVER]
    )
    lines = _warnings(caplog)
    assert len(lines) == (0 if server_on else 1)
    assert all("\n" not in line and "autovacuum = on" in line for line in lines)


@pytest.mark.postgres
def test_a_ledger_table_with_autovacuum_off_is_named_in_one_warning_line(
    postgres_ledger: MigratedDatabase, caplog: pytest.LogCaptureFixture
) -> None:
    with postgres_ledger.engine.begin() as connection:
        server = [] if connection.scalar(text("SHOW autovacuum")) == "on" else [SERVER]
        connection.execute(text("ALTER TABLE holds SET (autovacuum_enabled = off)"))
        connection.execute(text("ALTER TABLE users SET (autovacuum_enabled = true)"))
    caplog.set_level(logging.WARNING, logger=LOGGER)
    ledger = Ledger(postgres_ledger.engine)
    assert ledger.warn_if_autovacuum_off() == [*server, "holds"]
    [line] = _warnings(caplog)
    assert "holds" in line and "users" not in line and "\n" not in line
    with postgres_ledger.engine.begin() as connection:
        connection.execute(text("ALTER TABLE holds RESET (autovacuum_enabled)"))
    assert ledger.warn_if_autovacuum_off() == server


def test_the_warning_says_where_it_is_off_and_what_to_do() -> None:
    assert warning_line([]) is None
    server = warning_line([SERVER])
    assert server is not None
    assert "off on the database server" in server and "`autovacuum = on`" in server
    both = warning_line([SERVER, "holds", "balances"])
    assert both is not None and "and for holds, balances" in both
    table = warning_line(["holds"])
    assert table is not None
    assert "for the ledger's table holds" in table and "RESET (autovacuum_enabled)" in table
    for line in (server, both, table):
        assert "\n" not in line and "docs/operations/postgresql.md" in line


def test_sqlite_has_no_autovacuum_to_warn_about(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger=LOGGER)
    with migrated_database("sqlite", tmp_path) as db:
        assert Ledger(db.engine).warn_if_autovacuum_off() == []
        with db.engine.connect() as connection:
            assert autovacuum_gaps(connection) == []
    assert _warnings(caplog) == []
