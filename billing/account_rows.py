"""Locked accounts as plain rows, for the operations that move many users' money at once.

Settling a batch and placing a group of holds touch a handful of users hundreds of times a
second. Loading each user, balance and budget as ORM instances and letting the unit of work
find what changed costs more CPU than the SQL itself, so these paths lock the rows with one
select (the budget row comes with it: read once per transaction), move the balances in
Python and write every changed balance with one executemany UPDATE, both sent to the driver
directly (`billing.driver_sql`). The locking rules are
`billing.postings`': balance rows `FOR UPDATE` on PostgreSQL, in the order of the users' names.

The rare cases that need the full machinery go through the ORM functions on the same,
already locked rows, and the plain row is brought up to date afterwards, so it stays the
truth for the rest of the transaction: a budget period to open (`open_periods`, which runs
`grants.open_period` before any balance moves) and a hold placed again (`hold_groups`
writes its rows first and reads the user's row back after `holds.place_hold`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, fields
from datetime import datetime
from functools import cache
from typing import Any, Unpack, cast

from sqlalchemy import Dialect, Table
from sqlalchemy.orm import Session

from inference_auctions.billing.driver_sql import Columns, Conversion, Query, driver_cursor
from inference_auctions.billing.errors import UnknownUser
from inference_auctions.billing.grants import open_period, period_at
from inference_auctions.billing.models import (
    Balance,
    Budget,
    EntryKind,
    User,
)
from inference_auctions.billing.periods import Period
from inference_auctions.billing.postings import (
    Account,
    EntryDetails,
    balance_moves,
    check_name,
    entry_values,
)

BALANCES = cast(Table, Balance.__table__)
BUDGETS = cast(Table, Budget.__table__)
USERS = cast(Table, User.__table__)


@dataclass(frozen=True, slots=True)
class BudgetRow:
    """A user's budget row as read under the lock (the fields the period rules read)."""

    user_id: int
    amount_micros: int
    period: Period
    timezone: str
    batch_cap_micros: int | None
    current_period_start: datetime
    pending_amount_micros: int | None
    pending_period: Period | None
    pending_timezone: str | None
    pending_from: datetime | None


@dataclass(slots=True)
class AccountRow:
    """A locked user with its balance, moved in Python and written by `write_balances`."""

    user_id: int
    name: str
    disabled: bool
    balance_micros: int
    held_micros: int
    budget: BudgetRow
    changed: bool = False

    @property
    def available(self) -> int:
        """Funds not held for any request."""
        return self.balance_micros - self.held_micros

    def entry(
        self,
        kind: EntryKind,
        amount_micros: int,
        *,
        key: str,
        now: datetime,
        **details: Unpack[EntryDetails],
    ) -> dict[str, Any]:
        """Move the balance by one entry and return the entry as a row to insert."""
        balance_delta, held_delta = balance_moves(kind, amount_micros)
        self.balance_micros += balance_delta
        self.held_micros += held_delta
        self.changed = True
        return entry_values(self.user_id, kind, amount_micros, key=key, now=now, **details)


_BUDGET_FIELDS = [field.name for field in fields(BudgetRow)]

# What `lock_rows` reads, in order: the user, its balance, its budget row.
_LOCKED_USER = Columns(USERS, ("name", "disabled"))
_LOCKED_BALANCE = Columns(BALANCES, ("balance_micros", "held_micros"))
_LOCKED_BUDGET = Columns(BUDGETS, tuple(_BUDGET_FIELDS))
_WRITTEN_BALANCE = Columns(BALANCES, ("balance_micros", "held_micros", "updated_at", "user_id"))


@dataclass(frozen=True, slots=True)
class _Statements:
    """`lock_rows` and `write_balances` for one dialect (`billing.driver_sql`)."""

    lock: str
    lock_results: Conversion
    write: str
    write_binds: Conversion


@cache
def _statements(dialect: Dialect) -> _Statements:
    def qualified(columns: Columns) -> list[str]:
        return [f"{columns.table.name}.{name}" for name in columns.quoted(dialect)]

    read = [_LOCKED_USER, _LOCKED_BALANCE, _LOCKED_BUDGET]
    lock = (
        f"SELECT {', '.join(name for columns in read for name in qualified(columns))} "
        "FROM users JOIN balances ON balances.user_id = users.id "
        "JOIN budgets ON budgets.user_id = users.id "
        "WHERE users.name IN ({in}) ORDER BY users.name"
    )
    if dialect.name == "postgresql":
        lock += " FOR UPDATE OF balances"
    written = _WRITTEN_BALANCE.quoted(dialect)
    write = (
        f"UPDATE balances SET {', '.join(f'{name} = ?' for name in written[:-1])} "
        f"WHERE {written[-1]} = ?"
    )
    return _Statements(
        lock=lock,
        lock_results=Conversion(p for columns in read for p in columns.result_processors(dialect)),
        write=write,
        write_binds=_WRITTEN_BALANCE.bind(dialect),
    )


def lock_rows(session: Session, names: Iterable[str]) -> dict[str, AccountRow]:
    """Lock the accounts of those of `names` that exist, in name order (names are valid)."""
    query = lock_query(session, names)
    if query is None:
        return {}
    rows = driver_cursor(session).execute(query.sql, query.params, query.listed)
    return locked_accounts(session, rows)


def lock_query(session: Session, names: Iterable[str]) -> Query | None:
    """The statement of `lock_rows`, to send with others (`DriverCursor.read_together`);
    its rows go to `locked_accounts`. None when there is nobody to lock."""
    wanted = sorted(set(names))
    if not wanted:
        return None
    return Query(_statements(driver_cursor(session).dialect).lock, wanted, len(wanted))


def locked_accounts(session: Session, rows: Iterable[Sequence[Any]]) -> dict[str, AccountRow]:
    """The accounts in the rows of `lock_query`."""
    statements = _statements(driver_cursor(session).dialect)
    accounts = {}
    for raw in rows:
        row = statements.lock_results(raw)
        accounts[row[0]] = AccountRow(
            user_id=row[4],
            name=row[0],
            disabled=bool(row[1]),
            balance_micros=row[2],
            held_micros=row[3],
            budget=BudgetRow(*row[4:]),
        )
    return accounts


def lock_known_rows(
    session: Session, names: Iterable[str], locked: Mapping[str, AccountRow] | None = None
) -> dict[str, AccountRow]:
    """Lock the accounts of `names` in name order; raise `UnknownUser` for a missing one.
    With `locked` (accounts this transaction already locked), they are taken from there."""
    wanted = sorted({check_name(name) for name in names})
    found = lock_rows(session, wanted) if locked is None else locked
    for name in wanted:
        if name not in found:
            raise UnknownUser(name)
    return {name: found[name] for name in wanted}


def open_periods(session: Session, accounts: Mapping[str, AccountRow], now: datetime) -> None:
    """Open the current budget period of every account whose boundary has passed.

    The common case, no boundary since the last operation, is decided from the rows alone.
    Otherwise the period is opened by `grants.open_period` itself (expiring what is available
    and granting the new period): the caller holds the lock and must not have moved the
    balance yet, since the ORM reads it from the database.
    """
    for name in sorted(accounts):
        row = accounts[name]
        if period_at(row.budget, now) > row.budget.current_period_start:
            assert not row.changed, "a period opens before the balance moves"
            reload_row(session, row, _open_with_orm(session, row, now))


def _open_with_orm(session: Session, row: AccountRow, now: datetime) -> Account:
    user = session.get(User, row.user_id, populate_existing=True)
    balance = session.get(Balance, row.user_id, populate_existing=True)
    # Fresh from the database too: `open_period` reads it through the identity map.
    session.get(Budget, row.user_id, populate_existing=True)
    assert user is not None and balance is not None
    account = Account(user, balance)
    open_period(session, account, now)
    session.flush()
    return account


def reload_row(session: Session, row: AccountRow, account: Account) -> None:
    """Take over the balance and budget an ORM operation left on a locked account."""
    budget = session.get(Budget, row.user_id)
    assert budget is not None
    row.disabled = account.user.disabled
    row.balance_micros = account.balance.balance_micros
    row.held_micros = account.balance.held_micros
    row.budget = BudgetRow(*(getattr(budget, name) for name in _BUDGET_FIELDS))


def write_balances(session: Session, accounts: Sequence[AccountRow], now: datetime) -> None:
    """Write the changed balances, one driver call for all of them."""
    changed = [row for row in accounts if row.changed]
    if not changed:
        return
    cursor = driver_cursor(session)
    statements = _statements(cursor.dialect)
    cursor.execute_many(
        statements.write,
        [
            statements.write_binds((row.balance_micros, row.held_micros, now, row.user_id))
            for row in changed
        ],
    )
    for row in changed:
        row.changed = False
