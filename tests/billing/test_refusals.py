"""Bad input is refused with an error that names the problem, and the ledger stays as it was."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import pytest

from inference_auctions.billing import (
    InsufficientFunds,
    InvalidAmount,
    InvalidInput,
    Ledger,
    LedgerError,
    UnknownUser,
    UserDisabled,
)
from tests.billing.helpers import batch_of, snapshot
from tests.db_fixtures import MigratedDatabase

START = datetime(2025, 1, 1, tzinfo=UTC)

Operation = Callable[[Ledger], object]

CASES: list[tuple[str, Operation, type[LedgerError], str]] = [
    (
        "negative hold",
        lambda book: book.place_hold("alice", "r9", -1),
        InvalidAmount,
        "amount_micros: must not be negative",
    ),
    (
        "float hold",
        lambda book: book.place_hold("alice", "r9", 1.0),  # type: ignore[arg-type]
        InvalidAmount,
        "must be an integer",
    ),
    (
        "bool hold",
        lambda book: book.place_hold("alice", "r9", True),
        InvalidAmount,
        "must be an integer",
    ),
    (
        "huge hold",
        lambda book: book.place_hold("alice", "r9", 10**19),
        InvalidAmount,
        "above the maximum",
    ),
    (
        "empty rid",
        lambda book: book.place_hold("alice", "", 1),
        InvalidInput,
        "rid: must be a non-empty",
    ),
    (
        "overdraw",
        lambda book: book.place_hold("alice", "r9", 1_001),
        InsufficientFunds,
        "1000 micro-credits available",
    ),
    (
        "unknown holder",
        lambda book: book.place_hold("zed", "r9", 1),
        UnknownUser,
        "unknown user 'zed'",
    ),
    (
        "disabled holder",
        lambda book: book.place_hold("off", "r9", 1),
        UserDisabled,
        "'off' is disabled",
    ),
    (
        "negative grant",
        lambda book: book.grant("alice", START, -5),
        InvalidAmount,
        "must not be negative",
    ),
    ("zero grant", lambda book: book.grant("alice", START, 0), InvalidAmount, "must be positive"),
    (
        "naive grant",
        lambda book: book.grant("alice", START.replace(tzinfo=None), 5),
        InvalidInput,
        "period_start",
    ),
    ("unknown grantee", lambda book: book.grant("zed", START, 5), UnknownUser, "'zed'"),
    (
        "zero adjustment",
        lambda book: book.adjust("alice", 0, reason="x"),
        InvalidAmount,
        "must be non-zero",
    ),
    (
        "overdrawing adjustment",
        lambda book: book.adjust("alice", -1_001, reason="x"),
        InsufficientFunds,
        "1001 requested",
    ),
    ("blank reason", lambda book: book.adjust("alice", 5, reason=" "), InvalidInput, "reason"),
    (
        "negative refund",
        lambda book: book.refund("b0", "alice", "x", -3),
        InvalidAmount,
        "must not be negative",
    ),
    (
        "negative budget",
        lambda book: book.set_budget("alice", budget_micros=-1),
        InvalidAmount,
        "budget_micros",
    ),
    ("unknown budget", lambda book: book.set_budget("zed", budget_micros=1), UnknownUser, "'zed'"),
    (
        "bad time zone",
        lambda book: book.set_budget("alice", timezone="Utopia"),
        InvalidInput,
        "timezone",
    ),
    ("unknown disable", lambda book: book.disable_user("zed"), UnknownUser, "'zed'"),
    (
        "bad user name",
        lambda book: book.create_user("a b", budget_micros=1),
        InvalidInput,
        "not a valid user name",
    ),
    (
        "negative charge",
        lambda book: book.settle_batch(*batch_of("b9", [("r1", "alice", 10)], {"alice": -1})),
        InvalidInput,
        "must not be negative",
    ),
    (
        "unknown charged user",
        lambda book: book.settle_batch(*batch_of("b9", [("r1", "zed", 10)], {})),
        UnknownUser,
        "'zed'",
    ),
    (
        "bad kind",
        lambda book: book.entries("alice", kind="gift"),
        InvalidInput,
        "kind: must be one of",
    ),
    ("bad cursor", lambda book: book.entries("alice", cursor="abc"), InvalidInput, "cursor"),
    ("bad limit", lambda book: book.entries("alice", limit=0), InvalidInput, "limit"),
    (
        "bad summary",
        lambda book: book.summary("alice", by="year"),
        InvalidInput,
        "by: must be one of",
    ),
    (
        "bad export",
        lambda book: book.export("alice", "xml"),
        InvalidInput,
        "format: must be one of csv, json",
    ),
    (
        "bad expiry age",
        lambda book: book.expire_holds(max_age=timedelta(0)),
        InvalidInput,
        "max_age",
    ),
    (
        "naive rollover",
        lambda book: book.rollover(datetime(2025, 1, 1)),
        InvalidInput,
        "now: must be",
    ),
]


@pytest.mark.parametrize(
    ("operation", "error", "message"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_refused_operations_leave_the_ledger_unchanged(
    ledger: Ledger,
    ledger_db: MigratedDatabase,
    operation: Operation,
    error: type[LedgerError],
    message: str,
) -> None:
    ledger.create_user("alice", budget_micros=1_000)
    ledger.create_user("off", budget_micros=1_000)
    ledger.disable_user("off")
    ledger.place_hold("alice", "r1", 0)
    before = snapshot(ledger_db.engine)
    with pytest.raises(error, match=message):
        operation(ledger)
    assert snapshot(ledger_db.engine) == before
