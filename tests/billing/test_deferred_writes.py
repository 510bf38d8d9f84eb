"""A group commit reads first, in one round trip, and sends its writes with the COMMIT
(`billing.group_commit`, `DriverCursor.defer_writes`): fewer round trips, the same ledger.

Deferred writes must stay invisible to nobody: a statement of another path in the same
transaction (the ORM's) finds them done, a rollback drops them unsent (also for the next
transaction on the same pooled connection), and a constraint they break fails the commit,
writing nothing. A claim that breaks one is still found and left out alone.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from bench.round_trips import RoundTrips
from inference_auctions.billing import (
    ClaimedBatch,
    HoldInput,
    HoldView,
    Ledger,
    ServedInput,
)
from inference_auctions.billing.database import create_ledger_engine
from inference_auctions.billing.driver_sql import driver_cursor
from inference_auctions.billing.models import EntryKind, LedgerEntry, User
from inference_auctions.billing.postings import entry_values, insert_entries
from tests.billing.helpers import claim_of
from tests.db_fixtures import MigratedDatabase

_NOW = datetime(2025, 1, 15, 12, 0, tzinfo=UTC)


def _keys(session: Session) -> set[str]:
    return set(session.scalars(select(LedgerEntry.idempotency_key)))


def _defer_one_entry(session: Session, key: str) -> None:
    user_id = session.scalars(select(User.id).where(User.name == "ada")).one()
    cursor = driver_cursor(session)
    cursor.defer_writes()
    insert_entries(session, [entry_values(user_id, EntryKind.HOLD, 0, key=key, now=_NOW)])


def test_a_statement_of_another_path_finds_the_deferred_writes_done(ledger: Ledger) -> None:
    ledger.create_user("ada", budget_micros=1_000)
    with Session(ledger.engine) as session, session.begin():
        _defer_one_entry(session, "k1")
        assert "k1" in _keys(session)  # an ORM select in the same transaction
    with Session(ledger.engine) as session:
        assert "k1" in _keys(session)


def test_a_rollback_drops_deferred_writes_for_good(ledger_db: MigratedDatabase) -> None:
    engine = ledger_db.new_engine(pool_size=1, max_overflow=0)  # one pooled connection
    ledger = Ledger(engine)
    ledger.create_user("ada", budget_micros=1_000)
    with Session(engine) as session, session.begin():
        _defer_one_entry(session, "dropped")
        session.rollback()
    # The next transaction on the same connection commits without them.
    ledger.create_user("bob", budget_micros=1_000)
    with Session(engine) as session:
        assert "dropped" not in _keys(session)
        assert session.scalar(select(func.count()).select_from(User)) == 2


def test_a_deferred_write_that_breaks_a_constraint_fails_the_commit_whole(
    ledger: Ledger,
) -> None:
    ledger.create_user("ada", budget_micros=1_000)
    with Session(ledger.engine) as session, session.begin():
        before = _keys(session)
    with pytest.raises(IntegrityError), Session(ledger.engine) as session, session.begin():
        _defer_one_entry(session, "once")
        _defer_one_entry(session, "once")  # the same idempotency key twice
    with Session(ledger.engine) as session:
        assert _keys(session) == before


def test_a_claim_that_breaks_a_constraint_is_left_out_alone(ledger: Ledger) -> None:
    ledger.create_user("ada", budget_micros=10_000)
    ledger.create_user("bob", budget_micros=10_000)
    first = ledger.commit_group([HoldInput("ada", "a0", 1_000)], [], [])
    assert isinstance(first.placed[0], HoldView)
    settled = ledger.commit_group([], [], [claim_of("b1", {"a0": ("ada", 1_000)}, 400)])
    assert isinstance(settled.claimed[0], ClaimedBatch)
    outcome = ledger.commit_group(
        [HoldInput("ada", "a1", 2_000), HoldInput("bob", "b1r", 3_000)],
        [],
        [
            claim_of("b1", {"a1": ("ada", 2_000)}, 700),  # a batch id settled before
            claim_of("b2", {"b1r": ("bob", 3_000)}, 1_500),
        ],
    )
    assert [type(p) for p in outcome.placed] == [HoldView, HoldView]
    reused, good = outcome.claimed
    assert isinstance(reused, IntegrityError)
    assert isinstance(good, ClaimedBatch) and good.settled is not None
    ada, bob = ledger.balance("ada"), ledger.balance("bob")
    assert (ada.balance_micros, ada.held_micros) == (10_000 - 400, 2_000)  # a1 still held
    assert (bob.balance_micros, bob.held_micros) == (10_000 - 1_500, 0)
    assert ledger.reconcile().ok


def test_a_request_settled_and_served_in_one_group_is_served(ledger: Ledger) -> None:
    ledger.create_user("ada", budget_micros=10_000)
    outcome = ledger.commit_group(
        [HoldInput("ada", "r1", 1_000)],
        [ServedInput("r1", 3, 12.5), ServedInput("nobody", None, None)],
        [claim_of("b1", {"r1": ("ada", 1_000)}, 600)],
    )
    assert outcome.served == [True, False]
    assert _status(ledger, "r1") == "served"
    assert ledger.reconcile().ok


@pytest.fixture
def relayed_ledger(ledger_db: MigratedDatabase) -> Iterator[tuple[Ledger, RoundTrips]]:
    if ledger_db.backend == "sqlite":
        pytest.skip("SQLite runs in this process: there are no round trips to count")
    relay = RoundTrips(ledger_db.url)
    engine = create_ledger_engine(relay.url, pool_size=1, max_overflow=0)
    try:
        yield Ledger(engine), relay
    finally:
        engine.dispose()
        relay.close()


def test_a_lone_request_costs_three_round_trips_to_settle_and_one_to_serve(
    relayed_ledger: tuple[Ledger, RoundTrips],
) -> None:
    ledger, relay = relayed_ledger
    ledger.create_user("ada", budget_micros=10_000)
    ledger.commit_group([HoldInput("ada", "warm", 10)], [], [])  # the pool's connection
    with relay.counting() as settling:
        outcome = ledger.commit_group(
            [HoldInput("ada", "r1", 1_000)], [], [claim_of("b1", {"r1": ("ada", 1_000)}, 600)]
        )
    assert isinstance(outcome.claimed[0], ClaimedBatch)
    with relay.counting() as serving:
        assert ledger.commit_group([], [ServedInput("r1", None, 5.0)], []).served == [True]
    # Settling: BEGIN with the locks and reads (`billing.postgres_connection`), every write
    # together, COMMIT. Serving: one statement that commits itself and says whether it moved
    # the request. With a read before each write and each statement on its own: 7 and 4;
    # with psycopg's own wait for the BEGIN: 4 and 1.
    assert (settling, serving) == ([3], [1])
    assert _status(ledger, "r1") == "served"
    assert ledger.reconcile().ok


def _status(ledger: Ledger, rid: str) -> str:
    found = ledger.find_request(rid)
    assert found is not None
    return str(found.status.value)
