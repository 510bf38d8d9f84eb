from __future__ import annotations

import dataclasses
from datetime import timedelta

import pytest

from inference_auctions.billing import (
    ChargeExceedsHold,
    CompletionInput,
    HoldNotOpen,
    HoldState,
    IdempotencyConflict,
    InvalidBatch,
    InvalidInput,
    Ledger,
    RefundExceedsCharge,
    RequestStatus,
    UnknownBatch,
    UnknownRequest,
)
from tests.billing.helpers import batch_of, entries_total, get_hold, hold_and_settle, snapshot
from tests.db_fixtures import MigratedDatabase

BIDS = [("r1", "alice", 400), ("r2", "bob", 300), ("r3", "alice", 100)]
CHARGES = {"alice": 250, "bob": 0}


@pytest.fixture
def funded(ledger: Ledger) -> Ledger:
    ledger.create_user("alice", budget_micros=1_000)
    ledger.create_user("bob", budget_micros=1_000)
    for rid, user, bid in BIDS:
        ledger.place_hold(user, rid, bid)
    return ledger


def test_settle_charges_and_releases_in_one_go(funded: Ledger) -> None:
    result = funded.settle_batch(*batch_of("b1", BIDS, CHARGES))
    assert dict(result.charges_micros) == {"alice": 250, "bob": 0}
    assert dict(result.released_micros) == {"alice": 500, "bob": 300}
    alice, bob = funded.balance("alice"), funded.balance("bob")
    assert (alice.balance_micros, alice.held_micros, alice.spent_this_period_micros) == (
        750,
        0,
        250,
    )
    assert (bob.balance_micros, bob.held_micros) == (1_000, 0)
    hold = get_hold(funded, "r1")
    assert hold is not None and (hold.state, hold.batch_id) == (HoldState.SETTLED, "b1")
    request = funded.find_request("r3")
    assert request is not None
    assert (request.batch_id, request.user, request.position) == ("b1", "alice", 2)
    assert request.status is RequestStatus.SCHEDULED
    charges = funded.entries("alice", kind="charge").entries
    assert [(e.amount_micros, e.batch_id) for e in charges] == [(-250, "b1")]
    assert funded.reconcile().ok


def test_replaying_a_batch_changes_nothing(funded: Ledger, ledger_db: MigratedDatabase) -> None:
    first = funded.settle_batch(*batch_of("b1", BIDS, CHARGES))
    before = snapshot(ledger_db.engine)
    again = funded.settle_batch(*batch_of("b1", BIDS, {"alice": 250}))  # a zero charge omitted
    assert again == first and again.replayed and not first.replayed
    batch, requests, charges = batch_of("b1", BIDS, CHARGES)
    restamped = dataclasses.replace(batch, closed_at=batch.closed_at + timedelta(seconds=3))
    assert funded.settle_batch(restamped, requests, charges) == first
    assert snapshot(ledger_db.engine) == before


@pytest.mark.parametrize(
    ("bids", "charges", "detail"),
    [
        (BIDS, {"alice": 251}, "charges differ for 'alice'"),
        (BIDS, {"alice": 200, "bob": 50}, "charges differ for 'alice', 'bob'"),
        ([BIDS[1], BIDS[0], BIDS[2]], CHARGES, "the batch fields or its requests differ"),
    ],
)
def test_a_conflicting_replay_is_refused(
    funded: Ledger,
    ledger_db: MigratedDatabase,
    bids: list[tuple[str, str, int]],
    charges: dict[str, int],
    detail: str,
) -> None:
    funded.settle_batch(*batch_of("b1", BIDS, CHARGES))
    before = snapshot(ledger_db.engine)
    with pytest.raises(IdempotencyConflict, match=detail):
        funded.settle_batch(*batch_of("b1", bids, charges))
    assert snapshot(ledger_db.engine) == before


def test_a_charge_above_the_users_holds_is_refused(
    funded: Ledger, ledger_db: MigratedDatabase
) -> None:
    before = snapshot(ledger_db.engine)
    with pytest.raises(ChargeExceedsHold) as caught:
        funded.settle_batch(*batch_of("b1", BIDS, {"alice": 501}))
    assert (caught.value.name, caught.value.charge_micros, caught.value.held_micros) == (
        "alice",
        501,
        500,
    )
    assert snapshot(ledger_db.engine) == before


def test_settling_a_released_or_settled_hold_is_refused(funded: Ledger) -> None:
    funded.release("r2")
    with pytest.raises(HoldNotOpen, match="'r2' is released"):
        funded.settle_batch(*batch_of("b1", BIDS, CHARGES))
    funded.settle_batch(*batch_of("b1", BIDS[:1], {"alice": 10}))
    with pytest.raises(HoldNotOpen, match="'r1' is settled"):
        funded.settle_batch(*batch_of("b2", BIDS[:1], {"alice": 10}))


def _malformed(name: str) -> tuple[object, ...]:
    batch, requests, charges = batch_of("b1", BIDS, CHARGES)
    if name == "n":
        return dataclasses.replace(batch, n=2), requests, charges
    if name == "revenue":
        return dataclasses.replace(batch, revenue_micros=1), requests, charges
    if name == "positions":
        return (
            batch,
            [requests[0], requests[1], dataclasses.replace(requests[2], position=1)],
            charges,
        )
    if name == "duplicate":
        return (
            batch,
            [requests[0], requests[1], dataclasses.replace(requests[0], position=2)],
            charges,
        )
    if name == "stranger":
        return batch, requests, {**charges, "carol": 0}
    if name == "negative":
        return dataclasses.replace(batch, revenue_micros=240), requests, {"alice": 250, "bob": -10}
    if name == "priority":
        return batch, [dataclasses.replace(requests[0], priority=1.5), *requests[1:]], charges
    if name == "bid":
        return batch, [dataclasses.replace(requests[0], bid_micros=401), *requests[1:]], charges
    if name == "owner":
        return batch, [dataclasses.replace(requests[0], user="bob"), *requests[1:]], charges
    if name == "naive":
        naive = batch.closed_at.replace(tzinfo=None)
        return dataclasses.replace(batch, closed_at=naive), requests, charges
    raise AssertionError(name)


@pytest.mark.parametrize(
    ("case", "error", "message"),
    [
        ("n", InvalidBatch, "n is 2 but 3 requests"),
        ("revenue", InvalidBatch, "charges sum to 250"),
        ("positions", InvalidBatch, "positions must be 0..2"),
        ("duplicate", InvalidBatch, "'r1' appears twice"),
        ("stranger", InvalidBatch, "'carol', who has no request"),
        ("negative", InvalidInput, "must not be negative"),
        ("priority", InvalidBatch, "priority must be a number in"),
        ("bid", InvalidBatch, "bids 401 micro-credits but holds only 400"),
        ("owner", InvalidBatch, "held for another user"),
        ("naive", InvalidInput, "closed_at: must be a timezone-aware"),
    ],
)
def test_malformed_batches_are_refused_and_change_nothing(
    funded: Ledger,
    ledger_db: MigratedDatabase,
    case: str,
    error: type[Exception],
    message: str,
) -> None:
    before = snapshot(ledger_db.engine)
    with pytest.raises(error, match=message):
        funded.settle_batch(*_malformed(case))  # type: ignore[arg-type]
    assert snapshot(ledger_db.engine) == before


def test_a_request_without_a_hold_is_refused(funded: Ledger) -> None:
    with pytest.raises(UnknownRequest, match="'r9'"):
        funded.settle_batch(*batch_of("b1", [*BIDS[:2], ("r9", "alice", 0)], CHARGES))


def test_refund_gives_back_the_charge_once(funded: Ledger) -> None:
    funded.settle_batch(*batch_of("b1", BIDS, CHARGES))
    first = funded.refund("b1", "alice", "engine failed")
    assert (first.amount_micros, first.charged_micros, first.refunded_total_micros) == (
        250,
        250,
        250,
    )
    assert funded.refund("b1", "alice", "engine failed").amount_micros == 250
    assert funded.balance("alice").balance_micros == 1_000
    assert funded.balance("alice").spent_this_period_micros == 0
    with pytest.raises(IdempotencyConflict):
        funded.refund("b1", "alice", "engine failed", 100)
    assert funded.refund("b1", "bob", "engine failed").amount_micros == 0
    assert entries_total(funded, "alice") == funded.balance("alice").balance_micros


def test_partial_refunds_per_request_never_exceed_the_charge(funded: Ledger) -> None:
    funded.settle_batch(*batch_of("b1", BIDS, CHARGES))
    assert funded.refund("b1", "alice", "r1 failed", 200, rid="r1").refunded_total_micros == 200
    assert funded.refund("b1", "alice", "r1 failed", 200, rid="r1").amount_micros == 200
    with pytest.raises(RefundExceedsCharge, match="exceeds the 50 left"):
        funded.refund("b1", "alice", "r3 failed", 51, rid="r3")
    assert funded.refund("b1", "alice", "r3 failed", rid="r3").amount_micros == 50
    assert funded.refund("b1", "alice", "everything").amount_micros == 0
    with pytest.raises(InvalidInput, match="not one of 'bob'"):
        funded.refund("b1", "bob", "wrong user", rid="r1")
    with pytest.raises(UnknownBatch, match="'b9'"):
        funded.refund("b9", "alice", "no such batch")
    assert funded.reconcile().ok


def test_complete_request_records_the_outcome(funded: Ledger) -> None:
    funded.settle_batch(*batch_of("b1", BIDS, CHARGES))
    view = funded.complete_request("r1", "served", cached_tokens=8, ttft_ms=12.5)
    assert (view.status, view.cached_tokens, view.ttft_ms) == (RequestStatus.SERVED, 8, 12.5)
    with pytest.raises(InvalidInput, match="cached_tokens: must be an integer in \\[0, 10\\]"):
        funded.complete_request("r2", "served", cached_tokens=11)
    with pytest.raises(InvalidInput, match="status: must be 'served' or 'failed'"):
        funded.complete_request("r2", "done")
    with pytest.raises(UnknownRequest, match="no batch settled it"):
        funded.complete_request("r9", "failed")
    assert funded.find_request("r9") is None


def test_complete_requests_records_a_batch_all_or_nothing(funded: Ledger) -> None:
    funded.settle_batch(*batch_of("b1", BIDS, CHARGES))
    done = [CompletionInput("r1", "served", 3, 1.5), CompletionInput("r2", "failed")]
    views = funded.complete_requests(done)
    assert [(v.rid, v.status) for v in views] == [("r1", "served"), ("r2", "failed")]
    with pytest.raises(UnknownRequest):
        funded.complete_requests([CompletionInput("r1", "failed"), CompletionInput("r9", "served")])
    assert funded.find_request("r1").status == RequestStatus.SERVED  # type: ignore[union-attr]


def test_refund_unserved_refunds_lost_requests_once(funded: Ledger) -> None:
    funded.settle_batch(*batch_of("b1", BIDS, CHARGES))
    # Recent scheduled requests may still be at an engine: left alone.
    assert funded.refund_unserved(timedelta(hours=1)) == []
    refunded = funded.refund_unserved(timedelta(0))
    assert [(r.user, r.amount_micros) for r in refunded] == [("alice", 250)]  # bob paid 0
    assert funded.refund_unserved(timedelta(0)) == []
    assert funded.balance("alice").balance_micros == 1_000
    assert funded.find_request("r1").status == RequestStatus.FAILED  # type: ignore[union-attr]
    assert funded.reconcile().ok


def test_refund_unserved_leaves_served_requests_charged(funded: Ledger) -> None:
    funded.settle_batch(*batch_of("b1", BIDS, CHARGES))
    funded.complete_requests([CompletionInput(rid, "served") for rid, _, _ in BIDS])
    assert funded.refund_unserved(timedelta(0)) == []
    assert funded.balance("alice").balance_micros == 750


def test_many_batches_keep_the_books_balanced(ledger: Ledger) -> None:
    ledger.create_user("alice", budget_micros=10_000)
    ledger.create_user("bob", budget_micros=10_000)
    for k in range(5):
        bids = [(f"a{k}", "alice", 500), (f"b{k}", "bob", 300)]
        hold_and_settle(ledger, f"batch-{k}", bids, {"alice": 100 * k, "bob": 50})
    assert ledger.balance("alice").balance_micros == 10_000 - 1_000
    assert ledger.balance("bob").balance_micros == 10_000 - 250
    for name in ("alice", "bob"):
        assert entries_total(ledger, name) == ledger.balance(name).balance_micros
    assert ledger.reconcile().ok


def test_a_user_disabled_after_holding_is_still_settled(funded: Ledger) -> None:
    funded.disable_user("alice")
    result = funded.settle_batch(*batch_of("b1", BIDS, CHARGES))
    assert result.charges_micros["alice"] == 250
    assert funded.balance("alice").balance_micros == 750
