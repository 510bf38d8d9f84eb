"""The statements sent to the driver directly read and write what SQLAlchemy would, and fail
as SQLAlchemy would fail: its exception classes, a lost connection invalidated."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from sqlalchemy import Dialect, select, text
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import DBAPIError, IntegrityError, OperationalError
from sqlalchemy.orm import Session

from inference_auctions.billing import HoldInput, HoldState, Ledger
from inference_auctions.billing.driver_sql import Columns, Conversion, driver_cursor
from inference_auctions.billing.models import Balance, Budget, EntryKind, Hold, LedgerEntry, User
from inference_auctions.billing.postings import BudgetRow, entry_values, insert_entries, lock_rows
from tests.billing.conftest import Clock
from tests.db_fixtures import MigratedDatabase, migrated_database

_NOW = datetime(2025, 1, 15, 12, 0, 0, 123456, tzinfo=UTC)


def test_rows_written_by_the_driver_read_back_through_the_orm_as_written(
    ledger_db: MigratedDatabase,
) -> None:
    ledger = Ledger(ledger_db.engine, clock=Clock(_NOW))
    ledger.create_user("ada", budget_micros=1_000)
    [view] = ledger.place_holds([HoldInput("ada", "r1", 250, fingerprint="f" * 64)])
    assert view.amount_micros == 250
    with Session(ledger_db.engine) as session:
        hold = session.get(Hold, "r1")
        assert hold is not None
        assert (hold.state, hold.amount_micros, hold.fingerprint) == (HoldState.OPEN, 250, "f" * 64)
        assert hold.created_at == _NOW and hold.created_at.tzinfo is not None
        assert hold.closed_at is None and hold.batch_id is None
        entry = session.scalars(
            select(LedgerEntry).where(LedgerEntry.idempotency_key == "hold:r1")
        ).one()
        assert (entry.kind, entry.amount_micros, entry.request_id) == (EntryKind.HOLD, 250, "r1")
        assert entry.created_at == _NOW
    assert ledger.balance("ada").held_micros == 250


def test_locked_rows_carry_the_budget_as_the_orm_reads_it(ledger_db: MigratedDatabase) -> None:
    ledger = Ledger(ledger_db.engine, clock=Clock(_NOW))
    ledger.create_user("ada", budget_micros=5_000, period="day", timezone="Europe/Paris")
    ledger.set_budget("ada", budget_micros=7_000, batch_cap_micros=900)  # pending from tomorrow
    with Session(ledger_db.engine) as session, session.begin():
        [(name, account)] = lock_rows(session, ["ada", "nobody"]).items()
        budget = session.scalars(select(Budget).join(User).where(User.name == "ada")).one()
        expected = BudgetRow(*(getattr(budget, field) for field in BudgetRow.__slots__))
    assert name == "ada" and account.budget == expected
    assert account.disabled is False
    assert expected.pending_from is not None and expected.pending_from.tzinfo is not None
    assert (account.balance_micros, account.held_micros) == (5_000, 0)


def test_a_constraint_broken_on_the_driver_raises_sqlalchemys_integrity_error(
    ledger_db: MigratedDatabase,
) -> None:
    ledger = Ledger(ledger_db.engine, clock=Clock(_NOW))
    ledger.create_user("ada", budget_micros=1_000)
    ledger.place_holds([HoldInput("ada", "r1", 10)])
    with Session(ledger_db.engine) as session, session.begin():
        user_id = session.scalars(select(User.id).where(User.name == "ada")).one()
        again = entry_values(user_id, EntryKind.HOLD, 10, key="hold:r1", now=_NOW)
        with pytest.raises(IntegrityError):
            insert_entries(session, [again])
        session.rollback()
    assert ledger.reconcile().ok


def test_each_transaction_of_a_session_gets_its_own_cursor(ledger_db: MigratedDatabase) -> None:
    with Session(ledger_db.engine) as session:
        with session.begin():
            first = driver_cursor(session)
            assert driver_cursor(session) is first
        with session.begin():
            second = driver_cursor(session)
            assert second is not first
            assert second.execute("SELECT 1 + ?", [1]) == [(2,)]


def test_a_connection_lost_under_the_driver_is_invalidated(tmp_path: object) -> None:
    with migrated_database("postgresql", tmp_path) as db:  # type: ignore[arg-type]
        ledger = Ledger(db.engine, clock=Clock(_NOW))
        ledger.create_user("ada", budget_micros=1_000)
        with (
            pytest.raises(OperationalError) as raised,
            Session(db.engine) as session,
            session.begin(),
        ):
            cursor = driver_cursor(session)
            [(pid,)] = cursor.execute("SELECT pg_backend_pid()")
            with db.new_engine().begin() as admin:
                admin.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})
            cursor.execute("SELECT 1")
        assert raised.value.connection_invalidated
        # The dead connection went back to the pool as invalid: the next write reconnects.
        [view] = ledger.place_holds([HoldInput("ada", "r1", 10)])
        assert view.amount_micros == 10


class _CountingCursor:
    """A driver cursor that counts its closing."""

    def __init__(self, cursor: Any, closed: list[int]) -> None:
        self._cursor = cursor
        self._closed = closed

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cursor, name)

    def close(self) -> None:
        self._closed.append(1)
        self._cursor.close()


def test_every_driver_cursor_is_closed_before_its_call_returns(
    ledger_db: MigratedDatabase,
) -> None:
    # An open cursor would be finalized by the garbage collector, in any thread, perhaps
    # while another transaction uses the same pooled connection.
    opened: list[_CountingCursor] = []
    closed: list[int] = []
    with Session(ledger_db.engine) as session, session.begin():
        cursor = driver_cursor(session)
        connection = cursor._dbapi_connection

        class Connection:
            def __getattr__(self, name: str) -> Any:
                return getattr(connection, name)

            def cursor(self) -> _CountingCursor:
                counting = _CountingCursor(connection.cursor(), closed)
                opened.append(counting)
                return counting

        cursor._dbapi_connection = Connection()  # type: ignore[assignment]
        assert cursor.execute("SELECT 1 + ?", [1]) == [(2,)]
        assert cursor.execute("SELECT 2") == [(2,)]
        with pytest.raises(DBAPIError):
            cursor.execute("SELECT * FROM no_such_table")
        session.rollback()
    assert len(opened) == len(closed) == 3


def test_statements_sent_together_all_run_and_fail_as_sqlalchemy_fails(
    ledger_db: MigratedDatabase,
) -> None:
    ledger = Ledger(ledger_db.engine, clock=Clock(_NOW))
    ledger.create_user("ada", budget_micros=1_000)
    with Session(ledger_db.engine) as session, session.begin():
        user_id = session.scalars(select(User.id).where(User.name == "ada")).one()
        cursor = driver_cursor(session)
        with cursor.together():
            insert_entries(session, [entry_values(user_id, EntryKind.HOLD, 0, key="k1", now=_NOW)])
            insert_entries(session, [entry_values(user_id, EntryKind.HOLD, 0, key="k2", now=_NOW)])
        keys = {row[0] for row in cursor.execute("SELECT idempotency_key FROM ledger_entries")}
        assert {"k1", "k2"} <= keys
        with pytest.raises(IntegrityError), cursor.together():
            insert_entries(session, [entry_values(user_id, EntryKind.HOLD, 0, key="k3", now=_NOW)])
            insert_entries(session, [entry_values(user_id, EntryKind.HOLD, 0, key="k1", now=_NOW)])
        session.rollback()


def test_a_conversion_converts_each_value_as_its_processor_does() -> None:
    conversion = Conversion([None, lambda value: f"<{value}>", lambda value: f"<{value}>"])
    earlier = datetime(2025, 1, 1, tzinfo=UTC)
    assert conversion((1, earlier, None)) == [1, f"<{earlier}>", None]  # None stays None
    assert conversion(("x", None, earlier)) == ["x", None, f"<{earlier}>"]


@pytest.mark.parametrize("dialect", [sqlite.dialect(), postgresql.psycopg.dialect()])
def test_a_timestamp_is_converted_once_for_every_table_that_writes_it(dialect: Dialect) -> None:
    # A group commit writes its `now` into holds, entries and balances: one processor, shared
    # by the three tables, answers the repeat from memory (the same object back).
    stamps = [
        Columns(table, ("created_at" if table is not Balance.__table__ else "updated_at",))
        for table in (Hold.__table__, LedgerEntry.__table__, Balance.__table__)
    ]
    processors = {id(columns.bind_processors(dialect)[0]) for columns in stamps}
    assert len(processors) == 1
    now = datetime(2025, 1, 1, 12, tzinfo=UTC)
    first = stamps[0].bind(dialect)([now])[0]
    assert stamps[2].bind(dialect)([now])[0] is first
    later = stamps[1].bind(dialect)([datetime(2025, 1, 1, 13, tzinfo=UTC)])[0]
    assert later != first
    # A type with parameters is not shared: an entry's kind and a hold's state are different
    # enums, which convert different members.
    kind = Columns(LedgerEntry.__table__, ("kind",)).bind_processors(dialect)[0]
    state = Columns(Hold.__table__, ("state",)).bind_processors(dialect)[0]
    assert kind is not state


def test_a_statement_run_once_per_row_returns_what_every_run_returned(
    ledger_db: MigratedDatabase,
) -> None:
    ledger = Ledger(ledger_db.engine, clock=Clock(_NOW))
    ledger.create_user("ada", budget_micros=1_000)
    ledger.create_user("bob", budget_micros=1_000)
    with Session(ledger_db.engine) as session, session.begin():
        cursor = driver_cursor(session)
        renamed = cursor.execute_many_returning(
            "UPDATE users SET name = ? WHERE name = ? RETURNING name",
            [("ada2", "ada"), ("nobody2", "nobody"), ("bob2", "bob")],
        )
        assert sorted(row[0] for row in renamed) == ["ada2", "bob2"]  # none for "nobody"
        if ledger_db.backend != "sqlite":  # SQLite's statements run at once, even there
            # A pipeline answers at its end: rows read inside it would be missing, silently.
            with pytest.raises(RuntimeError, match="together"), cursor.together():
                cursor.execute_many_returning("SELECT ? AS x", [(1,)])
        session.rollback()
