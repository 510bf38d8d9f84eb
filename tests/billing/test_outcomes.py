"""Per-request outcomes: conditional outcome writes, partial refunds, claims, re-opened holds."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta

import pytest

from inference_auctions.billing import HoldState, IdempotencyConflict, Ledger, RequestStatus
from inference_auctions.billing.errors import RequestNotScheduled
from inference_auctions.billing.inputs import BatchInput, RequestInput
from inference_auctions.billing.views import PricedRequestView
from tests.billing.conftest import Clock
from tests.billing.helpers import batch_of, entries_total, get_hold

BIDS = [("r1", "alice", 400), ("r2", "bob", 300), ("r3", "alice", 100)]
CHARGES = {"alice": 250, "bob": 120}


@pytest.fixture
def settled(ledger: Ledger) -> Ledger:
    ledger.create_user("alice", budget_micros=1_000)
    ledger.create_user("bob", budget_micros=1_000)
    for rid, user, bid in BIDS:
        ledger.place_hold(user, rid, bid, "fp-" + rid)
    ledger.settle_batch(*batch_of("b1", BIDS, CHARGES))
    return ledger


def test_served_and_recovery_exclude_each_other(settled: Ledger) -> None:
    settled.record_served("r1", cached_tokens=4, ttft_ms=12.5)
    assert {r.user for r in settled.refund_unserved(timedelta(0))} == {"alice", "bob"}
    with pytest.raises(RequestNotScheduled):
        settled.record_served("r2")  # recovery failed it first: no answer may follow
    view = settled.find_request("r1")
    assert view is not None and (view.status, view.cached_tokens) == (RequestStatus.SERVED, 4)
    with pytest.raises(RequestNotScheduled):
        settled.record_served("r1")  # an outcome is written once
    assert settled.reconcile().ok


def test_recovery_refunds_only_what_was_not_answered(settled: Ledger) -> None:
    settled.record_served("r1")
    refunds = settled.refund_unserved(timedelta(0))
    # Without a pricing rule recovery gives back the whole charge of each failed request's user;
    # alice's r1 was answered, but her r3 was not.
    assert sorted((r.user, r.amount_micros) for r in refunds) == [("alice", 250), ("bob", 120)]
    assert settled.refund_unserved(timedelta(0)) == []
    assert settled.find_request("r3").status is RequestStatus.FAILED  # type: ignore[union-attr]
    assert settled.reconcile().ok


def test_recovery_prices_failures_with_the_rule(settled: Ledger) -> None:
    seen: list[tuple[str, frozenset[str], int]] = []

    def rule(
        requests: Sequence[PricedRequestView], user: str, failed: frozenset[str], c: int
    ) -> int:
        seen.append((user, failed, c))
        return 40 if user == "alice" else 0

    settled.record_served("r1")
    refunds = settled.refund_unserved(timedelta(0), rule=rule)
    # Batches settled without their tree shape fall back to the whole charge; this one has none.
    assert sorted((r.user, r.amount_micros) for r in refunds) == [("alice", 250), ("bob", 120)]
    assert seen == []


def test_recovery_uses_the_rule_when_the_tree_shape_is_stored(ledger: Ledger) -> None:
    ledger.create_user("alice", budget_micros=1_000)
    ledger.create_user("bob", budget_micros=1_000)
    for rid, user, bid in BIDS:
        ledger.place_hold(user, rid, bid)
    batch, requests, charges = batch_of("b2", BIDS, CHARGES)
    shaped = [
        RequestInput(**{**_fields(r), "arrival": k, "tree_path": [1, k]})
        for k, r in enumerate(requests)
    ]
    ledger.settle_batch(batch, shaped, charges)
    seen: list[tuple[str, frozenset[str], int, list[list[int] | None]]] = []

    def rule(
        requests: Sequence[PricedRequestView], user: str, failed: frozenset[str], c: int
    ) -> int:
        seen.append((user, failed, c, [r.tree_path for r in requests]))
        return 40 if user == "alice" else 0

    ledger.record_served("r1")
    refunds = ledger.refund_unserved(timedelta(0), rule=rule)
    assert [(r.user, r.amount_micros) for r in refunds] == [("alice", 40)]
    assert ("alice", frozenset({"r3"}), 250, [[1, 0], [1, 1], [1, 2]]) in seen
    assert ledger.balance("bob").balance_micros == 880  # a refund of 0 moves nothing
    assert ledger.reconcile().ok


def _fields(record: RequestInput) -> dict[str, object]:
    return {name: getattr(record, name) for name in RequestInput.__dataclass_fields__}


def test_partial_refunds_accumulate_and_never_exceed_the_charge(settled: Ledger) -> None:
    first = settled.record_failed("r1", "b1", "alice", target_micros=100, reason="engine")
    assert (first.amount_micros, first.refunded_total_micros) == (100, 100)
    # The second failure's target covers both failures: only the difference is refunded.
    second = settled.record_failed("r3", "b1", "alice", target_micros=10_000, reason="engine")
    assert (second.amount_micros, second.refunded_total_micros) == (150, 250)
    assert settled.balance("alice").balance_micros == 1_000
    with pytest.raises(RequestNotScheduled):
        settled.record_failed("r3", "b1", "alice", target_micros=250, reason="again")
    assert settled.refund_unserved(timedelta(0)) != []  # bob's r2 is still unanswered
    assert entries_total(settled, "alice") == 1_000
    assert settled.reconcile().ok


def test_a_failure_worth_nothing_refunds_nothing(settled: Ledger) -> None:
    result = settled.record_failed("r3", "b1", "alice", target_micros=0, reason="engine")
    assert result.amount_micros == 0
    assert settled.balance("alice").balance_micros == 750
    assert settled.find_request("r3").status is RequestStatus.FAILED  # type: ignore[union-attr]


def test_a_released_hold_is_opened_again_by_the_same_payload(ledger: Ledger) -> None:
    ledger.create_user("alice", budget_micros=1_000)
    ledger.place_hold("alice", "x", 300, "fp")
    ledger.release("x", "client left")
    assert ledger.balance("alice").available_micros == 1_000
    again = ledger.place_hold("alice", "x", 300, "fp")
    assert again.state is HoldState.OPEN
    assert ledger.balance("alice").available_micros == 700
    ledger.release("x", "left again")
    assert ledger.place_hold("alice", "x", 300, "fp").state is HoldState.OPEN
    with pytest.raises(IdempotencyConflict):
        ledger.place_hold("alice", "x", 300, "another payload")  # same amount, other payload
    assert ledger.reconcile().ok


def test_claims_leave_out_holds_that_are_not_open(settled: Ledger) -> None:
    settled.place_hold("alice", "n1", 200)
    settled.place_hold("bob", "n2", 100)
    calls: list[list[str]] = []

    def clear(claimable: list[str]) -> tuple[BatchInput, list[RequestInput], dict[str, int]]:
        calls.append(claimable)
        bids = [(rid, {"n1": "alice", "n2": "bob"}[rid], 100) for rid in claimable]
        return batch_of("b2", bids, {"alice": 0, "bob": 30})

    # r1 was settled in b1 (e.g. by another replica): it leaves; n1 and n2 settle.
    claimed = settled.settle_claimable([("n1", "alice"), ("r1", "alice"), ("n2", "bob")], clear)
    assert calls == [["n1", "n2"]]
    assert dict(claimed.refused) == {"r1": "settled"}
    assert claimed.settled is not None and dict(claimed.settled.charges_micros)["bob"] == 30
    assert get_hold(settled, "n1").state is HoldState.SETTLED  # type: ignore[union-attr]
    nothing = settled.settle_claimable([("r2", "bob")], clear)
    assert nothing.settled is None and dict(nothing.refused) == {"r2": "settled"}
    assert settled.reconcile().ok


def test_a_hold_re_opened_after_a_period_boundary_belongs_to_the_new_period(
    timed_ledger: Ledger, clock: Clock
) -> None:
    timed_ledger.create_user("alice", budget_micros=1_000, period="day")
    timed_ledger.place_hold("alice", "x", 300, "fp")
    timed_ledger.release("x", "client left")
    clock.advance(days=1)  # yesterday's budget is gone; today's is granted
    again = timed_ledger.place_hold("alice", "x", 300, "fp")
    assert again.state is HoldState.OPEN
    balance = timed_ledger.balance("alice")
    assert (balance.held_micros, balance.available_micros) == (300, 700)
    timed_ledger.release("x", "left again")
    assert timed_ledger.balance("alice").available_micros == 1_000
    assert timed_ledger.reconcile().ok
