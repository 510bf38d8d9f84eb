"""The one way money moves: lock a user's balance row, append an entry, update the row.

Every service function that moves money locks the balance rows it touches first (`FOR UPDATE`
on PostgreSQL; SQLite's `BEGIN IMMEDIATE` already serializes writers), then validates, then
posts. Several rows are always locked in the order of the users' names, so two transactions
can never wait on each other in a cycle.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TypedDict, Unpack

from sqlalchemy import select
from sqlalchemy.orm import Session

from inference_auctions.billing.driver_sql import Columns, driver_cursor
from inference_auctions.billing.errors import IdempotencyConflict, InvalidInput, UnknownUser
from inference_auctions.billing.models import (
    BALANCE_KINDS,
    HELD_KINDS,
    ID_LENGTH,
    LEDGER_ENTRIES,
    NAME_LENGTH,
    REASON_LENGTH,
    Balance,
    EntryKind,
    LedgerEntry,
    User,
)
from inference_auctions.billing.records import EntryView

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


@dataclass(slots=True)
class Account:
    """A user row with its locked balance row."""

    user: User
    balance: Balance

    @property
    def available(self) -> int:
        """Funds not held for any request."""
        return self.balance.balance_micros - self.balance.held_micros


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


def lock_accounts(session: Session, names: Iterable[str]) -> dict[str, Account]:
    """Lock the accounts of `names` in name order; raise `UnknownUser` for a missing one."""
    wanted = sorted({check_name(name) for name in names})
    found = lock_existing_accounts(session, wanted)
    for name in wanted:
        if name not in found:
            raise UnknownUser(name)
    return found


def lock_existing_accounts(session: Session, names: Iterable[str]) -> dict[str, Account]:
    """Lock the accounts of those of `names` that exist, in name order (names are valid)."""
    wanted = sorted(set(names))
    if not wanted:
        return {}
    rows = session.execute(
        select(User, Balance)
        .join(Balance, Balance.user_id == User.id)
        .where(User.name.in_(wanted))
        .order_by(User.name)
        .with_for_update(of=Balance)
    ).all()
    return {user.name: Account(user, balance) for user, balance in rows}


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
    reason: str | None = None,
    batch_id: str | None = None,
    request_id: str | None = None,
    period_start: datetime | None = None,
) -> LedgerEntry:
    """Append one entry and move the locked balance row by it; callers validated already.

    `period_start` is the budget period the money belongs to (see `billing.grants`).
    """
    entry = LedgerEntry(
        **entry_row(
            account,
            kind,
            amount_micros,
            key=key,
            now=now,
            reason=reason,
            batch_id=batch_id,
            request_id=request_id,
            period_start=period_start,
        )
    )
    session.add(entry)
    return entry


class EntryDetails(TypedDict, total=False):
    """What an entry may say besides its user, kind, amount, key and time (each None if not
    given): the keyword arguments of `entry_values`, `entry_row` and `AccountRow.entry`."""

    reason: str | None
    batch_id: str | None
    request_id: str | None
    period_start: datetime | None


def entry_row(
    account: Account,
    kind: EntryKind,
    amount_micros: int,
    *,
    key: str,
    now: datetime,
    **details: Unpack[EntryDetails],
) -> dict[str, Any]:
    """Move the locked balance row by one entry and return the entry as a row to insert.

    For callers that write many entries at once with `insert_entries`, one statement for all
    of them; `post` is the same for a single entry written through the ORM.
    """
    balance_delta, held_delta = balance_moves(kind, amount_micros)
    account.balance.balance_micros += balance_delta
    account.balance.held_micros += held_delta
    account.balance.updated_at = now
    return entry_values(account.user.id, kind, amount_micros, key=key, now=now, **details)


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
    session: Session, key: str, user: User, kind: EntryKind, amount_micros: int
) -> LedgerEntry | None:
    """The entry already recorded under `key` if it matches; None if there is none.

    Raises `IdempotencyConflict` when the key holds a different user, kind or amount.
    """
    entry = find_entry(session, key)
    if entry is None:
        return None
    if (entry.user_id, entry.kind, entry.amount_micros) != (user.id, kind, amount_micros):
        raise IdempotencyConflict(
            key,
            f"recorded {entry.kind.value} of {entry.amount_micros} micro-credits,"
            f" now {kind.value} of {amount_micros} for user {user.name!r}",
        )
    return entry
