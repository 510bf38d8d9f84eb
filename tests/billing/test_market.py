"""Spend and auctions since a moment, and recent clearing samples, on SQLite and PostgreSQL."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy.orm import Session

from inference_auctions.billing import InvalidInput, Ledger
from inference_auctions.billing.market import auctions_since, recent_clearing, spend_since
from tests.billing.helpers import batch_of

BIDS = [("r1", "alice", 400), ("r2", "bob", 300), ("r3", "alice", 100)]
CHARGES = {"alice": 250, "bob": 0}
BATCH_TIME = datetime(2025, 1, 15, 12, 0, tzinfo=UTC)  # when `batch_of` closes its batches


@pytest.fixture
def settled(ledger: Ledger) -> Ledger:
    ledger.create_user("alice", budget_micros=1_000)
    ledger.create_user("bob", budget_micros=1_000)
    ledger.create_user("carol", budget_micros=1_000)
    for rid, user, bid in BIDS:
        ledger.place_hold(user, rid, bid)
    ledger.settle_batch(*batch_of("b1", BIDS, CHARGES))
    ledger.refund("b1", "alice", "engine failed", 50)
    return ledger


def test_spend_since_is_charges_net_of_refunds(settled: Ledger) -> None:
    with Session(settled.engine) as session:
        alice = spend_since(session, "alice", datetime(2000, 1, 1, tzinfo=UTC))
        bob = spend_since(session, "bob", datetime(2000, 1, 1, tzinfo=UTC))
        later = spend_since(session, "alice", datetime.now(UTC) + timedelta(hours=1))
    assert (alice.spent_micros, alice.auctions) == (200, 1)
    assert (bob.spent_micros, bob.auctions) == (0, 1)  # took part, paid nothing
    assert (later.spent_micros, later.auctions) == (0, 0)


def test_auctions_count_batches_not_requests(settled: Ledger) -> None:
    with Session(settled.engine) as session:
        assert auctions_since(session, "alice", BATCH_TIME) == 1  # two requests, one batch
        assert auctions_since(session, "alice", BATCH_TIME + timedelta(seconds=1)) == 0
        assert auctions_since(session, "carol", BATCH_TIME) == 0


def test_a_naive_since_is_refused_by_name(settled: Ledger) -> None:
    with Session(settled.engine) as session, pytest.raises(InvalidInput, match="since"):
        spend_since(session, "alice", datetime(2025, 1, 1))


def test_recent_clearing_gives_each_users_priority_and_charge(settled: Ledger) -> None:
    with Session(settled.engine) as session:
        samples = recent_clearing(session, BATCH_TIME - timedelta(minutes=1), max_batches=10)
        none = recent_clearing(session, BATCH_TIME + timedelta(minutes=1), max_batches=10)
    by_user = {(s.requests, s.priority, s.charge_micros) for s in samples}
    # alice: positions 0 and 2 of 3 (priorities 1 and 0), charged 250 (refunds are not prices);
    # bob: position 1, priority 0.5, charged nothing.
    assert by_user == {(2, 1.0, 250), (1, 0.5, 0)}
    assert {s.batch_id for s in samples} == {"b1"} and none == []
