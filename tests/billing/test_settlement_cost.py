"""Settling a batch costs a fixed number of statements, and its fast path keeps the period rules.

Settlement runs once per auction batch on the server's only ledger writer, so its cost must
not grow with the batch: every table is written by one statement whatever the number of
requests and users, and each user's budget row is read once, with the lock.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import Engine, event

from inference_auctions.billing import HoldInput, HoldState, Ledger
from inference_auctions.billing.driver_sql import DriverCursor
from inference_auctions.billing.inputs import BatchInput, RequestInput
from tests.billing.conftest import Clock
from tests.billing.helpers import batch_of, get_hold
from tests.db_fixtures import MigratedDatabase


@contextmanager
def _statements(engine: Engine) -> Iterator[list[str]]:
    """The statements sent to the database meanwhile, one per execute or executemany call:
    through SQLAlchemy, and straight to the driver (`billing.driver_sql`)."""
    sent: list[str] = []

    def record(*args: Any) -> None:
        sent.append(str(args[2]))

    driver_run = DriverCursor._run

    def run_and_record(
        cursor: DriverCursor, statement: str, params: Any, *, many: bool
    ) -> list[Any]:
        sent.append(statement)
        return driver_run(cursor, statement, params, many=many)

    event.listen(engine, "before_cursor_execute", record)
    DriverCursor._run = run_and_record  # type: ignore[method-assign]
    try:
        yield sent
    finally:
        DriverCursor._run = driver_run  # type: ignore[method-assign]
        event.remove(engine, "before_cursor_execute", record)


def _clearing(
    charges: Mapping[str, int], bids: Mapping[str, tuple[str, int]], batch_id: str
) -> Any:
    def clear(rids: list[str]) -> tuple[BatchInput, Sequence[RequestInput], Mapping[str, int]]:
        return batch_of(batch_id, [(rid, *bids[rid]) for rid in rids], charges)

    return clear


def _settle(ledger: Ledger, users: list[str], n: int, batch_id: str) -> list[str]:
    bids = {f"{batch_id}-{k}": (users[k % len(users)], 100) for k in range(n)}
    placed = ledger.place_holds([HoldInput(u, rid, bid) for rid, (u, bid) in bids.items()])
    assert all(type(view).__name__ == "HoldView" for view in placed)
    charges = {user: 50 * sum(1 for u, _ in bids.values() if u == user) for user in users}
    with _statements(ledger.engine) as sent:
        claimed = ledger.settle_claimable(
            [(rid, user) for rid, (user, _) in bids.items()], _clearing(charges, bids, batch_id)
        )
    assert claimed.settled is not None and dict(claimed.settled.charges_micros) == charges
    return [s for s in sent if not s.startswith(("BEGIN", "COMMIT", "SAVEPOINT", "RELEASE"))]


def test_settling_costs_the_same_statements_for_any_batch(ledger_db: MigratedDatabase) -> None:
    ledger = Ledger(ledger_db.engine)
    users = [f"user{k}" for k in range(8)]
    for user in users:
        ledger.create_user(user, budget_micros=10**9)
    one = _settle(ledger, users[:1], 1, "small")
    many = _settle(ledger, users, 64, "large")
    assert len(many) == len(one), many
    # The budget rows come with the locked balances, not one query per user.
    assert sum("budgets" in s for s in many) == 1
    assert sum(s.startswith("UPDATE holds") for s in many) == 1
    assert sum(s.startswith("UPDATE balances") for s in many) == 1
    for user in users:
        balance = ledger.balance(user)
        settled = 9 if user == "user0" else 8  # user0 was in the small batch too
        assert (balance.balance_micros, balance.held_micros) == (10**9 - settled * 50, 0)
    assert ledger.reconcile().ok


def test_a_settlement_that_opens_a_period_counts_the_charge_in_the_holds_period(
    timed_ledger: Ledger, clock: Clock
) -> None:
    # alice's day ends with 400 held; bob's budget has no periods.
    timed_ledger.create_user("alice", budget_micros=1_000, period="day")
    timed_ledger.create_user("bob", budget_micros=1_000)
    timed_ledger.place_holds([HoldInput("alice", "a1", 400), HoldInput("bob", "b1", 300)])
    clock.now = datetime(2025, 1, 16, 0, 0, 1, tzinfo=UTC)
    bids = {"a1": ("alice", 400), "b1": ("bob", 300)}
    claimed = timed_ledger.settle_claimable(
        [("a1", "alice"), ("b1", "bob")], _clearing({"alice": 300, "bob": 200}, bids, "b")
    )
    assert claimed.settled is not None
    assert dict(claimed.settled.released_micros) == {"alice": 400, "bob": 300}
    # The new day: 600 unused expired, 1,000 granted; the charge of 300 counts in the day the
    # hold was placed, whose unused 100 expires with it.
    alice = timed_ledger.balance("alice")
    assert (alice.balance_micros, alice.held_micros, alice.spent_this_period_micros) == (
        1_000,
        0,
        0,
    )
    assert alice.period_start == datetime(2025, 1, 16, tzinfo=UTC)
    day_one = datetime(2025, 1, 15, tzinfo=UTC)
    entries = [
        (e.kind.value, e.amount_micros, e.period_start)
        for e in timed_ledger.entries("alice", limit=100).entries
    ]
    assert sorted(entries[-5:], key=str) == sorted(
        [
            ("adjustment", -600, day_one),
            ("grant", 1_000, day_one + timedelta(days=1)),
            ("release", -400, day_one),
            ("charge", -300, day_one),
            ("adjustment", -100, day_one),
        ],
        key=str,
    )
    bob = timed_ledger.balance("bob")
    assert (bob.balance_micros, bob.held_micros) == (800, 0)
    for rid in bids:
        hold = get_hold(timed_ledger, rid)
        assert hold is not None and (hold.state, hold.batch_id) == (HoldState.SETTLED, "b")
    assert timed_ledger.reconcile().ok
