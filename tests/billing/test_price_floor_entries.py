"""The posted price floor in the ledger (docs/SPEC.md section 7): each entrant's part taken at
settlement as a `floor` entry beside its user's charge, recorded with the request, given back
once to a failed request (by the server or by crash recovery), kept by a served one; settling
the same batch again writes nothing; reconcile counts it; the upgrade allows it."""

from __future__ import annotations

import dataclasses
from datetime import timedelta

import pytest
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError

from inference_auctions.billing import (
    BatchInput,
    InvalidBatch,
    Ledger,
    RequestInput,
    SummaryRecord,
    hold_micros,
    migrate,
)
from inference_auctions.billing.fees import refund_floor
from tests.billing.conftest import Clock
from tests.billing.helpers import batch_of, refund_part
from tests.db_fixtures import MigratedDatabase

BUDGET = 1_000_000
FLOOR = 3_000


def _batch(
    batch_id: str, bids: list[tuple[str, str, int]], charges: dict[str, int], floors: dict[str, int]
) -> tuple[BatchInput, list[RequestInput], dict[str, int]]:
    """A rolling head of `bids` (rid, user, bid) with each request's floor part."""
    batch, requests, charges = batch_of(batch_id, bids, charges)
    batch = dataclasses.replace(batch, pricing_rule="rolling-slots", priority_slots=8)
    requests = [dataclasses.replace(r, floor_micros=floors.get(r.rid, 0)) for r in requests]
    return batch, requests, charges


def _settle(
    ledger: Ledger,
    batch_id: str,
    bids: list[tuple[str, str, int]],
    charges: dict[str, int],
    floors: dict[str, int],
) -> None:
    for rid, user, bid in bids:
        ledger.place_hold(user, rid, bid)
    ledger.settle_batch(*_batch(batch_id, bids, charges, floors))


def _floors(ledger: Ledger, name: str) -> list[tuple[int, str | None, str | None]]:
    return [
        (e.amount_micros, e.batch_id, e.request_id)
        for e in ledger.entries(name, kind="floor").entries
    ]


@pytest.fixture
def users(ledger: Ledger) -> Ledger:
    for name in ("alice", "bob"):
        ledger.create_user(name, budget_micros=BUDGET)
    return ledger


BIDS = [("a1", "alice", 300_000), ("a2", "alice", 50_000), ("b1", "bob", 10_000), ("o", "bob", 5)]


def test_the_floor_is_taken_once_per_user_beside_the_charge(users: Ledger) -> None:
    ledger = users
    # bob's "o" bid below the floor and went outside: it pays no floor.
    floors = {"a1": FLOOR, "a2": FLOOR, "b1": FLOOR}
    _settle(ledger, "h", BIDS, {"alice": 1_000, "bob": 0}, floors)
    assert _floors(ledger, "alice") == [(-2 * FLOOR, "h", None)]
    assert _floors(ledger, "bob") == [(-FLOOR, "h", None)]
    assert ledger.balance("alice").balance_micros == BUDGET - 1_000 - 2 * FLOOR
    assert ledger.balance("bob").balance_micros == BUDGET - FLOOR
    # The same batch settled again (a retried commit) moves nothing more.
    replay = ledger.settle_batch(*_batch("h", BIDS, {"alice": 1_000, "bob": 0}, floors))
    assert replay.replayed and replay.floors_micros == {"alice": 2 * FLOOR, "bob": FLOOR}
    assert _floors(ledger, "alice") == [(-2 * FLOOR, "h", None)]
    assert ledger.reconcile().ok


def test_a_failed_request_gets_its_own_floor_back_once(users: Ledger) -> None:
    ledger = users
    _settle(ledger, "h", BIDS, {"alice": 1_000, "bob": 0}, {"a1": FLOOR, "a2": 2_000})
    result = ledger.record_failed("a2", "h", "alice", target_micros=0, reason="engine failed")
    assert (result.amount_micros, result.floor_micros) == (0, 2_000)
    assert _floors(ledger, "alice") == [(-(FLOOR + 2_000), "h", None), (2_000, "h", "a2")]
    ledger.record_served("a1")  # served: keeps its floor
    assert ledger.balance("alice").balance_micros == BUDGET - 1_000 - FLOOR
    assert ledger.reconcile().ok


def test_a_floor_given_back_is_never_given_back_again(users: Ledger) -> None:
    ledger = users
    floors = {"a1": FLOOR, "a2": 2_000, "b1": FLOOR}
    _settle(ledger, "h", BIDS, {"alice": 1_000, "bob": 0}, floors)
    ledger.record_failed("a2", "h", "alice", target_micros=0, reason="engine failed")
    after_failure = ledger.balance("alice").balance_micros
    # The refund of a2's floor again (a retried failure): a1's floor, still taken, would cover
    # a second one; the refund's key stops it.
    assert refund_part(ledger, refund_floor, "alice", "h", "a2") == 0
    assert _floors(ledger, "alice") == [(-(FLOOR + 2_000), "h", None), (2_000, "h", "a2")]
    assert ledger.balance("alice").balance_micros == after_failure
    # Nor does a floor come back beyond what the user's floors took: with a1's given back too,
    # bob's request, failed on alice's account, gets her nothing.
    assert refund_part(ledger, refund_floor, "alice", "h", "a1") == FLOOR
    assert refund_part(ledger, refund_floor, "alice", "h", "b1") == 0
    assert ledger.balance("alice").balance_micros == BUDGET - 1_000
    # bob's own failure still gets his floor back: the refused one wrote nothing under its key.
    ledger.record_failed("b1", "h", "bob", target_micros=0, reason="engine failed")
    assert _floors(ledger, "bob") == [(-FLOOR, "h", None), (FLOOR, "h", "b1")]
    assert ledger.reconcile().ok


def test_recovery_gives_the_floor_of_an_unserved_request_back_once(
    ledger_db: MigratedDatabase, clock: Clock
) -> None:
    ledger = Ledger(ledger_db.engine, clock=clock)
    ledger.create_user("alice", budget_micros=BUDGET)
    bids = [("a1", "alice", 40_000), ("a2", "alice", 20_000)]
    _settle(ledger, "h", bids, {"alice": 600}, {"a1": FLOOR, "a2": FLOOR})
    ledger.record_served("a1")
    clock.advance(minutes=20)
    results = ledger.refund_unserved(timedelta(minutes=15))
    # Priced without a rule, the whole charge comes back; and a2's own floor, not a1's.
    assert [(r.amount_micros, r.floor_micros) for r in results] == [(600, FLOOR)]
    assert ledger.refund_unserved(timedelta(minutes=15)) == []  # a replay: nothing more
    assert _floors(ledger, "alice") == [(-2 * FLOOR, "h", None), (FLOOR, "h", "a2")]
    assert ledger.balance("alice").balance_micros == BUDGET - FLOOR
    assert ledger.reconcile().ok


def test_summaries_list_the_floors_and_reconcile(timed_ledger: Ledger) -> None:
    ledger = timed_ledger
    ledger.create_user("alice", budget_micros=BUDGET)
    fee = 700
    bids = [("a1", "alice", 300_000), ("a2", "alice", 50_000)]
    for rid, user, bid in bids:
        ledger.place_hold(user, rid, hold_micros(bid, fee))
    batch, requests, charges = _batch("h", bids, {"alice": 1_000}, {"a1": FLOOR, "a2": 2_000})
    ledger.settle_batch(dataclasses.replace(batch, request_fee_micros=fee), requests, charges)
    ledger.record_failed("a2", "h", "alice", target_micros=400, reason="engine failed")
    ledger.adjust("alice", -50, reason="correction")
    (row,) = ledger.summary("alice", "month")
    # a2's floor and fee came back with its share of the charge: a1's alone are left.
    assert (row.charged_micros, row.refunded_micros) == (1_000, 400)
    assert (row.fees_micros, row.floors_micros) == (fee, FLOOR)
    assert row.net_micros == (
        row.granted_micros
        - row.charged_micros
        + row.refunded_micros
        + row.adjusted_micros
        - row.fees_micros
        - row.floors_micros
    )
    assert row.net_micros == ledger.balance("alice").balance_micros
    # The record the API and the CLI give names it too.
    assert SummaryRecord.of(row).as_json()["floors_micros"] == FLOOR


def test_a_floor_above_the_bid_is_refused_whole(users: Ledger) -> None:
    ledger = users
    ledger.place_hold("bob", "b1", 1_000)
    with pytest.raises(InvalidBatch, match="floor of 1001 above its bid"):
        ledger.settle_batch(*_batch("h", [("b1", "bob", 1_000)], {"bob": 0}, {"b1": 1_001}))
    assert _floors(ledger, "bob") == []
    assert ledger.balance("bob").held_micros == 1_000  # the hold is still open


def test_an_old_ledger_takes_floors_after_the_upgrade(ledger_db: MigratedDatabase) -> None:
    ledger = Ledger(ledger_db.engine)
    ledger.create_user("old", budget_micros=BUDGET)
    ledger.place_hold("old", "r0", 200_000)
    ledger.settle_batch(*batch_of("b0", [("r0", "old", 200_000)], {"old": 0}))
    # History without floors goes back to the revision before them, and up again.
    migrate.downgrade(ledger_db.engine, "8e3b6d1f2a7c")
    assert ledger.reconcile().ok
    migrate.upgrade(ledger_db.engine)
    assert migrate.schema_drift(ledger_db.engine) == []
    _settle(ledger, "b1", [("r1", "old", 10_000)], {"old": 0}, {"r1": FLOOR})
    assert ledger.balance("old").balance_micros == BUDGET - FLOOR
    assert ledger.reconcile().ok
    with pytest.raises(DBAPIError, match="append-only"), ledger_db.engine.begin() as connection:
        connection.execute(text("UPDATE ledger_entries SET amount_micros = 1 WHERE kind = 'floor'"))
    with pytest.raises(RuntimeError, match="floor entries"):
        migrate.downgrade(ledger_db.engine, "8e3b6d1f2a7c")
