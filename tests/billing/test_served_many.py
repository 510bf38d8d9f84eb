"""Many requests recorded served in one transaction, and the race with crash recovery."""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from datetime import timedelta

import pytest

from inference_auctions.billing import (
    EntryKind,
    InvalidInput,
    Ledger,
    RefundResult,
    RequestNotScheduled,
    RequestStatus,
    ServedInput,
    UnknownRequest,
)
from tests.billing.helpers import batch_of, snapshot
from tests.db_fixtures import MigratedDatabase

BIDS = [("r1", "alice", 400), ("r2", "bob", 300), ("r3", "alice", 100)]
CHARGES = {"alice": 250, "bob": 120}


@pytest.fixture
def settled(ledger: Ledger) -> Ledger:
    ledger.create_user("alice", budget_micros=1_000)
    ledger.create_user("bob", budget_micros=1_000)
    for rid, user, bid in BIDS:
        ledger.place_hold(user, rid, bid)
    ledger.settle_batch(*batch_of("b1", BIDS, CHARGES))
    return ledger


def test_only_scheduled_requests_move_each_once(settled: Ledger) -> None:
    settled.record_failed("r2", "b1", "bob", target_micros=120, reason="engine")
    moved = settled.record_served_many(
        [
            ServedInput("r1", cached_tokens=4, ttft_ms=12.5),
            ServedInput("r2"),  # failed first: no answer may follow
            ServedInput("nowhere"),  # no batch settled it
            ServedInput("r3", ttft_ms=3),
            ServedInput("r1", cached_tokens=9),  # recorded a moment ago
        ]
    )
    assert moved == [True, False, False, True, False]
    r1, r2, r3 = (settled.find_request(rid) for rid in ("r1", "r2", "r3"))
    assert r1 is not None and (r1.status, r1.cached_tokens, r1.ttft_ms) == (
        RequestStatus.SERVED,
        4,
        12.5,
    )
    assert r2 is not None and r2.status is RequestStatus.FAILED
    assert r3 is not None and (r3.status, r3.cached_tokens, r3.ttft_ms) == (
        RequestStatus.SERVED,
        None,
        3.0,
    )
    assert settled.record_served_many([ServedInput("r1")]) == [False]
    assert settled.refund_unserved(timedelta(0)) == []
    assert settled.reconcile().ok


def test_record_served_tells_why_it_did_not_move(settled: Ledger) -> None:
    settled.record_failed("r2", "b1", "bob", target_micros=0, reason="engine")
    with pytest.raises(RequestNotScheduled) as failed:
        settled.record_served("r2")
    assert failed.value.status == "failed"
    with pytest.raises(UnknownRequest):
        settled.record_served("nowhere")
    settled.record_served("r1")
    with pytest.raises(RequestNotScheduled) as served:
        settled.record_served("r1")
    assert served.value.status == "served"


def test_a_malformed_record_writes_nothing(settled: Ledger, ledger_db: MigratedDatabase) -> None:
    before = snapshot(ledger_db.engine)
    for bad in (ServedInput("r3", cached_tokens=-1), ServedInput("r3", ttft_ms=float("nan"))):
        with pytest.raises(InvalidInput):
            settled.record_served_many([ServedInput("r1"), bad])
    assert snapshot(ledger_db.engine) == before


USERS = ["ann", "ben", "cat"]
BATCHES = 12
PER_BATCH = 6


def test_served_and_recovery_racing_end_each_request_once(ledger_db: MigratedDatabase) -> None:
    ledger = Ledger(ledger_db.new_engine(pool_size=6))
    for user in USERS:
        ledger.create_user(user, budget_micros=1_000_000)
    owner: dict[str, tuple[str, str]] = {}
    for b in range(BATCHES):
        bids = [(f"b{b}-{k}", USERS[(b + k) % 3], 1_000) for k in range(PER_BATCH)]
        for rid, user, bid in bids:
            ledger.place_hold(user, rid, bid)
            owner[rid] = (f"b{b}", user)
        charges = {user: 500 for _rid, user, _bid in bids}
        ledger.settle_batch(*batch_of(f"b{b}", bids, charges))
    rids = sorted(owner)
    moved: dict[str, bool] = {}
    refunds: list[RefundResult] = []
    failures: list[BaseException] = []
    # Recovery starts once some requests are served, then races the rest.
    started = threading.Event()

    def serve() -> None:
        try:
            for i in range(0, len(rids), 5):
                chunk = rids[i : i + 5]
                answers = ledger.record_served_many([ServedInput(r) for r in chunk])
                moved.update(zip(chunk, answers, strict=True))
                if i == 10:
                    started.set()
                time.sleep(0.01)  # leave recovery time to fail some of the rest
        except BaseException as exc:
            failures.append(exc)
        finally:
            started.set()

    def recover() -> None:
        try:
            started.wait(10)
            for _ in range(40):
                refunds.extend(ledger.refund_unserved(timedelta(0)))
        except BaseException as exc:
            failures.append(exc)

    threads = [threading.Thread(target=serve), threading.Thread(target=recover)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not failures, failures
    refunds.extend(ledger.refund_unserved(timedelta(0)))

    failed_in: dict[tuple[str, str], int] = defaultdict(int)
    for rid in rids:
        view = ledger.find_request(rid)
        assert view is not None
        # Exactly one outcome: served if and only if the served record moved it.
        assert view.status is (RequestStatus.SERVED if moved[rid] else RequestStatus.FAILED), rid
        if not moved[rid]:
            failed_in[owner[rid]] += 1
    refunded: dict[tuple[str, str], int] = defaultdict(int)
    for user in USERS:
        for entry in ledger.entries(user, kind=EntryKind.REFUND, limit=1000).entries:
            assert entry.batch_id is not None
            refunded[(entry.batch_id, user)] += entry.amount_micros
    # Refunds only where a request failed: the user's whole charge in that batch, once.
    assert refunded == dict.fromkeys(failed_in, 500)
    assert sum(r.amount_micros for r in refunds) == sum(refunded.values())
    assert ledger.reconcile().ok
