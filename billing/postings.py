"""The one way money moves: lock a user's account, append entries, write the balance row.

An `Account` is a locked user as a plain row: the user's name and flags, the balance row, and
the budget row read with it (one select, `lock_rows`). Every service function that moves money
locks the accounts it touches first (balance rows `FOR UPDATE` on PostgreSQL; SQLite's
`BEGIN IMMEDIATE` already serializes writers), then validates, then moves the balance in
Python (`Account.entry`) and writes the entries and the changed balances with one statement
each, sent to the driver directly (`billing.driver_sql`): loading users and balances as ORM
instances and letting the unit of work find what changed costs more CPU than the SQL itself,
on paths that settle batches and place holds hundreds of times a second. Several accounts are
always locked in the order of the users' names, so two transactions can never wait on each
other in a cycle. A transaction locks a user once: locking it again returns the same `Account`
(`lock_accounts`), so every part of the transaction moves one row.

Budgets are ORM rows (`billing.grants` opens periods and changes budgets through them); an
account's `budget` is its budget as read under the lock, brought up to date by `open_period`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, fields
from datetime import UTC, datetime
from functools import cache
from typing import Any, TypedDict, Unpack, cast

from sqlalchemy import Dialect, Table, select
from sqlalchemy.orm import Session

from inference_auctions.billing.driver_sql import Columns, Conversion, Query, driver_cursor
from inference_auctions.billing.errors import IdempotencyConflict, InvalidInput, UnknownUser
from inference_auctions.billing.models import (
    BALANCE_KINDS,
    HELD_KINDS,
    ID_LENGTH,
    LEDGER_ENTRIES,
    NAME_LENGTH,
    REASON_LENGTH,
    Balance,
    Budget,
    EntryKind,
    LedgerEntry,
    User,
)
from inference_auctions.billing.periods import Period
from inference_auctions.billing.views import EntryView

BALANCES = cast(Table, Balance.__table__)
BUDGETS = cast(Table, Budget.__table__)
USERS = cast(Table, User.__table__)

# The columns an entry row of `entry_values` fills (the id is the database's).
_ENTRY_COLUMNS = Columns(
    LEDGER_ENTRIES,
    (
        "user_id",
        "kind",
        "amount_micros",
        "batch_id",
        "request_id",
        "reason",
        "idempotency_key",
        "created_at",
        "period_start",
    ),
)
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.@-]*", re.ASCII)
# The accounts the current transaction of a session has locked (`lock_accounts`).
_LOCKED_KEY = "inference_auctions.locked_accounts"


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

    @classmethod
    def of(cls, budget: Budget) -> BudgetRow:
        """The row of an ORM budget, as it stands in this transaction."""
        return cls(*(getattr(budget, name) for name in _BUDGET_FIELDS))


@dataclass(slots=True)
class Account:
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


def check_name(name: object, field: str = "name") -> str:
    """Return `name` if it is a valid user name."""
    if not isinstance(name, str) or not name:
        raise InvalidInput(field, "must be a non-empty string")
    if len(name) > NAME_LENGTH or not _NAME.fullmatch(name):
        raise InvalidInput(
            field,
            f"{name!r} is not a valid user name (letters, digits and _ . @ -, starting with a"
            f" letter or digit, at most {NAME_LENGTH} characters)",
        )
    return name


def check_id(value: object, field: str) -> str:
    """Return `value` if it is a usable request or batch id."""
    if not isinstance(value, str) or not value:
        raise InvalidInput(field, "must be a non-empty string")
    if len(value) > ID_LENGTH or not value.isprintable():
        raise InvalidInput(
            field, f"must be at most {ID_LENGTH} printable characters, got {value[:40]!r}"
        )
    return value


def check_reason(reason: object, field: str = "reason") -> str:
    """Return `reason` if it is a non-empty string that fits the column."""
    if not isinstance(reason, str) or not reason.strip():
        raise InvalidInput(field, "must be a non-empty string")
    if len(reason) > REASON_LENGTH:
        raise InvalidInput(field, f"must be at most {REASON_LENGTH} characters")
    return reason


def get_user(session: Session, name: str) -> User:
    """The user named `name`, without locking."""
    user = session.scalar(select(User).where(User.name == check_name(name)))
    if user is None:
        raise UnknownUser(name)
    return user


def lock_account(session: Session, name: str) -> Account:
    """Lock and return the account of `name`."""
    return lock_accounts(session, [name])[name]


def lock_accounts(
    session: Session, names: Iterable[str], locked: Mapping[str, Account] | None = None
) -> dict[str, Account]:
    """Lock the accounts of `names` in name order; raise `UnknownUser` for a missing one.
    An account this transaction locked already is not read again: it is the same `Account`.
    With `locked` (accounts the caller has locked), they are taken from there."""
    wanted = sorted({check_name(name) for name in names})
    if locked is None:
        known = _locked(session)
        missing = [name for name in wanted if name not in known]
        if missing:
            session.flush()  # a user created in this transaction is locked too
            lock_rows(session, missing)
        locked = known
    for name in wanted:
        if name not in locked:
            raise UnknownUser(name)
    return {name: locked[name] for name in wanted}


def _locked(session: Session) -> dict[str, Account]:
    """The accounts the session's current transaction has locked (a new transaction, a new
    dict: `driver_cursor`'s rule)."""
    cached = session.info.get(_LOCKED_KEY)
    transaction = session.get_transaction()
    if cached is not None and transaction is not None and cached[0] is transaction:
        return cast(dict[str, Account], cached[1])
    accounts: dict[str, Account] = {}
    session.info[_LOCKED_KEY] = (transaction, accounts)
    return accounts


def find_entry(session: Session, key: str) -> LedgerEntry | None:
    """The entry recorded under the idempotency key, if any."""
    return session.scalar(select(LedgerEntry).where(LedgerEntry.idempotency_key == key))


def post(
    session: Session,
    account: Account,
    kind: EntryKind,
    amount_micros: int,
    *,
    key: str,
    now: datetime,
    **details: Unpack[EntryDetails],
) -> None:
    """Append one entry and write the locked balance row moved by it, now; callers validated
    already. `period_start` is the budget period the money belongs to (see `billing.grants`).
    For many entries at once, `Account.entry` with `insert_entries` and `write_balances`."""
    insert_entries(session, [account.entry(kind, amount_micros, key=key, now=now, **details)])
    write_balances(session, [account], now)


class EntryDetails(TypedDict, total=False):
    """What an entry may say besides its user, kind, amount, key and time (each None if not
    given): the keyword arguments of `entry_values`, `post` and `Account.entry`."""

    reason: str | None
    batch_id: str | None
    request_id: str | None
    period_start: datetime | None


def balance_moves(kind: EntryKind, amount_micros: int) -> tuple[int, int]:
    """How an entry moves its user's balance row: (change of the balance, change of what is
    held): `BALANCE_KINDS` move the balance, `HELD_KINDS` (holds, releases) what is held."""
    if kind in BALANCE_KINDS:
        return amount_micros, 0
    if kind in HELD_KINDS:
        return 0, amount_micros
    return 0, 0


def entry_values(
    user_id: int,
    kind: EntryKind,
    amount_micros: int,
    *,
    key: str,
    now: datetime,
    **details: Unpack[EntryDetails],
) -> dict[str, Any]:
    """An entry as a row to insert, moving nothing (the caller moves the balance)."""
    return {
        "user_id": user_id,
        "kind": kind,
        "amount_micros": amount_micros,
        "batch_id": details.get("batch_id"),
        "request_id": details.get("request_id"),
        "reason": details.get("reason"),
        "idempotency_key": key,
        "created_at": now,
        "period_start": details.get("period_start"),
    }


def insert_entries(session: Session, rows: Sequence[Mapping[str, Any]]) -> None:
    """Insert entry rows made by `entry_row` or `entry_values`, one driver call for all."""
    driver_cursor(session).insert(_ENTRY_COLUMNS, rows)


def time_key(moment: datetime) -> str:
    """A moment rendered for use inside an idempotency key (UTC, microseconds)."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def entry_view(entry: LedgerEntry, user_name: str) -> EntryView:
    """The public view of an entry."""
    return EntryView(
        id=entry.id,
        user=user_name,
        kind=entry.kind,
        amount_micros=entry.amount_micros,
        batch_id=entry.batch_id,
        request_id=entry.request_id,
        reason=entry.reason,
        idempotency_key=entry.idempotency_key,
        created_at=entry.created_at,
        period_start=entry.period_start,
    )


def replay(
    session: Session, key: str, account: Account, kind: EntryKind, amount_micros: int
) -> LedgerEntry | None:
    """The entry already recorded under `key` if it matches; None if there is none.

    Raises `IdempotencyConflict` when the key holds a different user, kind or amount.
    """
    entry = find_entry(session, key)
    if entry is None:
        return None
    if (entry.user_id, entry.kind, entry.amount_micros) != (account.user_id, kind, amount_micros):
        raise IdempotencyConflict(
            key,
            f"recorded {entry.kind.value} of {entry.amount_micros} micro-credits,"
            f" now {kind.value} of {amount_micros} for user {account.name!r}",
        )
    return entry


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


def lock_rows(session: Session, names: Iterable[str]) -> dict[str, Account]:
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


def locked_accounts(session: Session, rows: Iterable[Sequence[Any]]) -> dict[str, Account]:
    """The accounts in the rows of `lock_query`."""
    statements = _statements(driver_cursor(session).dialect)
    accounts = {}
    for raw in rows:
        row = statements.lock_results(raw)
        accounts[row[0]] = Account(
            user_id=row[4],
            name=row[0],
            disabled=bool(row[1]),
            balance_micros=row[2],
            held_micros=row[3],
            budget=BudgetRow(*row[4:]),
        )
    _locked(session).update(accounts)
    return accounts


def write_balances(session: Session, accounts: Sequence[Account], now: datetime) -> None:
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
