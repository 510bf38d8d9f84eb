"""The request fee in the ledger (docs/SPEC.md section 5): held with the bid, taken once per
request at settlement as a `fee` entry beside the charge, given back once to a failed request,
kept by a served or abandoned one; reconcile, summaries, exports and upgrades count it."""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import HealthCheck, Phase, assume, given, settings
from hypothesis import strategies as st
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError

from inference_auctions.billing import (
    BatchInput,
    InvalidBatch,
    Ledger,
    RequestInput,
    hold_micros,
    migrate,
)
from inference_auctions.billing.fees import refund_fee
from inference_auctions.server.auction import AuctionRequest, run_auction
from inference_auctions.server.auction.charges import PricingRule, Repricer
from tests.auction.strategies import batches
from tests.billing.conftest import Clock
from tests.billing.helpers import batch_of, entries_total, refund_part, snapshot
from tests.db_fixtures import MigratedDatabase

FEE = 20_000
BUDGET = 1_000_000


def _batch_with_fee(
    batch_id: str, bids: list[tuple[str, str, int]], charges: dict[str, int]
) -> tuple[BatchInput, list[RequestInput], dict[str, int]]:
    """The batch of `bids` (rid, user, bid) cleared under fixed slots with the fee."""
    batch, requests, charges = batch_of(batch_id, bids, charges)
    batch = dataclasses.replace(
        batch, pricing_rule="fixed-slots", priority_slots=8, request_fee_micros=FEE
    )
    return batch, requests, charges


def _settle_with_fee(
    ledger: Ledger, batch_id: str, bids: list[tuple[str, str, int]], charges: dict[str, int]
) -> None:
    """Hold bid + fee for each request, then settle the batch under a rule with the fee."""
    for rid, user, bid in bids:
        ledger.place_hold(user, rid, hold_micros(bid, FEE))
    ledger.settle_batch(*_batch_with_fee(batch_id, bids, charges))


def _fees(ledger: Ledger, name: str) -> list[tuple[int, str | None, str | None]]:
    return [
        (e.amount_micros, e.batch_id, e.request_id)
        for e in ledger.entries(name, kind="fee").entries
    ]


@pytest.fixture
def users(ledger: Ledger) -> Ledger:
    for name in ("alice", "bob"):
        ledger.create_user(name, budget_micros=BUDGET)
    return ledger


def test_each_request_pays_the_fee_once_beside_its_charge(users: Ledger) -> None:
    ledger = users
    bids = [("a1", "alice", 300_000), ("b1", "bob", 100_000), ("a2", "alice", 0)]
    _settle_with_fee(ledger, "b", bids, {"alice": 14_285, "bob": 0})
    # One fee entry per user and batch: alice's two requests, bob's one (his charge is 0).
    assert _fees(ledger, "alice") == [(-2 * FEE, "b", None)]
    assert _fees(ledger, "bob") == [(-FEE, "b", None)]
    alice = ledger.balance("alice")
    assert (alice.balance_micros, alice.held_micros) == (BUDGET - 14_285 - 2 * FEE, 0)
    assert alice.spent_this_period_micros == 14_285 + 2 * FEE
    assert ledger.balance("bob").balance_micros == BUDGET - FEE
    assert entries_total(ledger, "alice") == alice.balance_micros
    assert ledger.reconcile().ok
    # A replay of the settlement moves nothing more and says what the first one moved.
    replay = ledger.settle_batch(*_batch_with_fee("b", bids, {"alice": 14_285, "bob": 0}))
    assert replay.replayed and dict(replay.fees_micros) == {"alice": 2 * FEE, "bob": FEE}
    assert _fees(ledger, "alice") == [(-2 * FEE, "b", None)]


def test_a_hold_of_the_bid_alone_cannot_settle_with_a_fee(
    users: Ledger, ledger_db: MigratedDatabase
) -> None:
    ledger = users
    ledger.place_hold("alice", "a1", 300_000)  # the bid, without the fee
    before = snapshot(ledger_db.engine)
    with pytest.raises(InvalidBatch, match="plus the request fee of 20000 but holds only 300000"):
        ledger.settle_batch(*_batch_with_fee("b", [("a1", "alice", 300_000)], {"alice": 0}))
    assert snapshot(ledger_db.engine) == before


def test_a_zero_bid_pays_the_fee_and_nothing_else(users: Ledger) -> None:
    ledger = users
    _settle_with_fee(ledger, "b", [("a0", "alice", 0)], {"alice": 0})
    assert ledger.balance("alice").balance_micros == BUDGET - FEE
    assert [e.kind.value for e in ledger.entries("alice").entries if e.batch_id == "b"] == [
        "release",
        "fee",
    ]


def test_a_failed_request_gets_its_own_fee_back_once(users: Ledger) -> None:
    ledger = users
    bids = [("a1", "alice", 300_000), ("a2", "alice", 0), ("b1", "bob", 100_000)]
    _settle_with_fee(ledger, "b", bids, {"alice": 100_000, "bob": 0})
    result = ledger.record_failed("a2", "b", "alice", target_micros=0, reason="engine failed")
    assert (result.amount_micros, result.fee_micros) == (0, FEE)  # a zero bid refunds no charge
    assert _fees(ledger, "alice") == [(-2 * FEE, "b", None), (FEE, "b", "a2")]
    ledger.record_served("a1")
    ledger.record_abandoned("b1", None, 5.0)  # left after its first token: keeps its fee
    assert ledger.balance("alice").balance_micros == BUDGET - 100_000 - FEE
    assert ledger.balance("bob").balance_micros == BUDGET - FEE
    assert _fees(ledger, "bob") == [(-FEE, "b", None)]
    assert ledger.reconcile().ok


def test_a_fee_given_back_is_never_given_back_again(users: Ledger) -> None:
    ledger = users
    bids = [("a1", "alice", 300_000), ("a2", "alice", 0), ("b1", "bob", 100_000)]
    _settle_with_fee(ledger, "b", bids, {"alice": 100_000, "bob": 0})
    ledger.record_failed("a2", "b", "alice", target_micros=0, reason="engine failed")
    after_failure = ledger.balance("alice").balance_micros
    # The refund of a2's fee again (a retried failure): a1's fee, still taken, would cover a
    # second one; the refund's key stops it.
    assert refund_part(ledger, refund_fee, "alice", "b", "a2") == 0
    assert _fees(ledger, "alice") == [(-2 * FEE, "b", None), (FEE, "b", "a2")]
    assert ledger.balance("alice").balance_micros == after_failure
    # Nor does a fee come back beyond what the user's fees took: with a1's given back too,
    # bob's request, failed on alice's account, gets her nothing.
    assert refund_part(ledger, refund_fee, "alice", "b", "a1") == FEE
    assert refund_part(ledger, refund_fee, "alice", "b", "b1") == 0
    assert ledger.balance("alice").balance_micros == BUDGET - 100_000
    # bob's own failure still gets his fee back: the refused one wrote nothing under its key.
    ledger.record_failed("b1", "b", "bob", target_micros=0, reason="engine failed")
    assert _fees(ledger, "bob") == [(-FEE, "b", None), (FEE, "b", "b1")]
    assert ledger.reconcile().ok


def test_recovery_gives_the_fees_of_unserved_requests_back(
    ledger_db: MigratedDatabase, clock: Clock
) -> None:
    ledger = Ledger(ledger_db.engine, clock=clock)
    ledger.create_user("alice", budget_micros=BUDGET)
    _settle_with_fee(ledger, "b", [("a1", "alice", 0), ("a2", "alice", 0)], {"alice": 0})
    ledger.record_served("a1")
    clock.advance(minutes=20)
    results = ledger.refund_unserved(timedelta(minutes=15))
    # Nothing of the charge to refund (zero bids), but the unserved request's fee comes back.
    assert [(r.amount_micros, r.fee_micros) for r in results] == [(0, FEE)]
    assert ledger.refund_unserved(timedelta(minutes=15)) == []
    assert ledger.balance("alice").balance_micros == BUDGET - FEE
    assert ledger.reconcile().ok


def test_summaries_and_exports_list_the_fees(users: Ledger) -> None:
    ledger = users
    _settle_with_fee(ledger, "b", [("a1", "alice", 300_000)], {"alice": 0})
    (row,) = ledger.summary("alice", "day")
    assert (row.fees_micros, row.net_micros) == (FEE, BUDGET - FEE)
    rows = list(csv.DictReader(io.StringIO(ledger.export("alice", "csv"))))
    assert [(r["kind"], r["amount_micros"]) for r in rows if r["kind"] == "fee"] == [
        ("fee", str(-FEE))
    ]
    fees = [e for e in json.loads(ledger.export(None, "json")) if e["kind"] == "fee"]
    assert [(e["user"], e["amount_micros"]) for e in fees] == [("alice", -FEE)]
    assert ledger.spend_since("alice", datetime(2000, 1, 1, tzinfo=UTC)).spent_micros == FEE


def test_an_old_ledger_takes_fees_after_the_upgrade(ledger_db: MigratedDatabase) -> None:
    """A ledger at the revision before fees keeps its history; the upgrade allows `fee`
    entries, and the database still refuses to rewrite an entry."""
    ledger = Ledger(ledger_db.engine)
    # Made first: today's users table (named keys, rate limits) is not the old revision's.
    ledger.create_user("old", budget_micros=BUDGET)
    migrate.downgrade(ledger_db.engine, "3b8d4c2e6f10")
    ledger.place_hold("old", "r0", 200_000)
    ledger.settle_batch(*batch_of("b0", [("r0", "old", 200_000)], {"old": 0}))
    migrate.upgrade(ledger_db.engine)
    assert migrate.schema_drift(ledger_db.engine) == []
    ledger.place_hold("old", "r1", hold_micros(0, FEE))
    ledger.settle_batch(*_batch_with_fee("b1", [("r1", "old", 0)], {"old": 0}))
    assert ledger.balance("old").balance_micros == BUDGET - FEE
    assert ledger.reconcile().ok
    with pytest.raises(DBAPIError, match="append-only"), ledger_db.engine.begin() as connection:
        connection.execute(text("UPDATE ledger_entries SET amount_micros = 1 WHERE kind = 'fee'"))
    with pytest.raises(DBAPIError), ledger_db.engine.begin() as connection:
        # A fee of 0 moves nothing: the sign constraint refuses it.
        connection.execute(
            text(
                "INSERT INTO ledger_entries (user_id, kind, amount_micros, idempotency_key,"
                " created_at) SELECT id, 'fee', 0, 'zero-fee', created_at FROM users"
            )
        )
    # The older schema has no form for the fees: going back is refused, nothing changed.
    with pytest.raises(RuntimeError, match="fee entries"):
        migrate.downgrade(ledger_db.engine, "3b8d4c2e6f10")
    # The fees' revision stays (a later one above it may have been undone before it refused).
    assert migrate.current_revision(ledger_db.engine) in ("5d2f8a1c9e47", migrate.head_revision())


@settings(
    max_examples=12,
    deadline=None,
    phases=[Phase.explicit, Phase.reuse, Phase.generate],
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(batch=batches(max_size=6), fee=st.sampled_from([0, 1, 7, 20_000]), data=st.data())
def test_nobody_pays_more_than_their_bids_plus_the_fees(
    ledger: Ledger, batch: list[AuctionRequest], fee: int, data: st.DataObject
) -> None:
    """Cleared by the auction, settled by the ledger, some requests failed and refunded as the
    server does: what each user pays (charge and fees) never exceeds its bids plus one fee per
    request, and no more than one fee per request it was served."""
    tag = uuid.uuid4().hex[:8]
    requests = [
        AuctionRequest(f"{tag}-{r.rid}", f"{r.user}-{tag}", r.tokens, min(r.bid, 10**9))
        for r in batch
    ]
    assume(requests)
    for user in {r.user for r in requests}:
        ledger.create_user(user, budget_micros=10**13)
    rule = PricingRule(slots=8, request_fee_micros=fee)
    outcome = run_auction(requests, rule)
    repricer = Repricer.from_outcome(outcome)
    for request in requests:
        ledger.place_hold(request.user, request.rid, hold_micros(request.bid, fee))
    record = BatchInput(
        batch_id=f"b-{tag}",
        closed_at=datetime(2026, 12, 3, tzinfo=UTC),
        n=outcome.size,
        revenue_micros=outcome.revenue,
        welfare_micros=int(outcome.welfare),
        pricing_rule=rule.name,
        priority_slots=rule.slots,
        request_fee_micros=fee,
    )
    paths = repricer.tree_paths()
    ledger.settle_batch(
        record,
        [
            RequestInput(
                rid=r.rid,
                user=r.user,
                position=outcome.positions[r.rid],
                priority=float(outcome.priority(r.rid)),
                bid_micros=r.bid,
                prompt_tokens=len(r.tokens),
                arrival=k,
                tree_path=paths[r.rid],
            )
            for k, r in enumerate(requests)
        ],
        outcome.payments,
    )
    failed = data.draw(st.sets(st.sampled_from([r.rid for r in requests])))
    by_user: dict[str, set[str]] = {}
    for request in requests:
        if request.rid in failed:
            gone = by_user.setdefault(request.user, set())
            gone.add(request.rid)
            target = repricer.failure_refund(request.user, gone, outcome.payments[request.user])
            ledger.record_failed(
                request.rid, record.batch_id, request.user, target_micros=target, reason="failed"
            )
        else:
            ledger.record_served(request.rid)
    for user in {r.user for r in requests}:
        mine = [r for r in requests if r.user == user]
        served = sum(1 for r in mine if r.rid not in failed)
        paid = 10**13 - ledger.balance(user).balance_micros
        assert 0 <= paid <= sum(r.bid for r in mine) + len(mine) * fee
        fees = -sum(e.amount_micros for e in ledger.entries(user, kind="fee").entries)
        assert fees == served * fee
    assert ledger.reconcile().ok
