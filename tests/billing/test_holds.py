from __future__ import annotations

from datetime import timedelta

import pytest

from inference_auctions.billing import (
    BatchCapExceeded,
    HoldState,
    IdempotencyConflict,
    InsufficientFunds,
    Ledger,
    UnknownRequest,
    UserDisabled,
)
from tests.billing.conftest import Clock
from tests.billing.helpers import get_hold


def test_a_hold_moves_funds_from_available_to_held(ledger: Ledger) -> None:
    ledger.create_user("alice", budget_micros=1_000)
    hold = ledger.place_hold("alice", "r1", 300)
    assert (hold.user, hold.amount_micros, hold.state) == ("alice", 300, HoldState.OPEN)
    view = ledger.balance("alice")
    assert (view.balance_micros, view.held_micros, view.available_micros) == (1_000, 300, 700)


def test_insufficient_funds_names_available_and_requested(ledger: Ledger) -> None:
    ledger.create_user("alice", budget_micros=1_000)
    ledger.place_hold("alice", "r1", 800)
    with pytest.raises(InsufficientFunds) as caught:
        ledger.place_hold("alice", "r2", 201)
    assert (caught.value.available_micros, caught.value.requested_micros) == (200, 201)
    assert "'alice' has 200 micro-credits available, 201 requested" in str(caught.value)
    assert ledger.place_hold("alice", "r3", 200).amount_micros == 200


def test_a_zero_hold_always_succeeds(ledger: Ledger) -> None:
    ledger.create_user("broke", budget_micros=0)
    assert ledger.place_hold("broke", "r1", 0).state is HoldState.OPEN


def test_placing_the_same_hold_twice_holds_once(ledger: Ledger) -> None:
    ledger.create_user("alice", budget_micros=1_000)
    first = ledger.place_hold("alice", "r1", 300)
    assert ledger.place_hold("alice", "r1", 300) == first
    assert ledger.balance("alice").held_micros == 300
    with pytest.raises(IdempotencyConflict, match="'hold:r1'"):
        ledger.place_hold("alice", "r1", 301)
    ledger.create_user("bob", budget_micros=1_000)
    with pytest.raises(IdempotencyConflict):
        ledger.place_hold("bob", "r1", 300)


def test_disabled_users_cannot_hold(ledger: Ledger) -> None:
    ledger.create_user("alice", budget_micros=1_000)
    ledger.disable_user("alice")
    with pytest.raises(UserDisabled, match="user 'alice' is disabled"):
        ledger.place_hold("alice", "r1", 1)


def test_the_batch_cap_bounds_what_is_held_at_once(ledger: Ledger) -> None:
    ledger.create_user("alice", budget_micros=1_000, batch_cap_micros=500)
    ledger.place_hold("alice", "r1", 400)
    with pytest.raises(BatchCapExceeded) as caught:
        ledger.place_hold("alice", "r2", 101)
    assert (caught.value.cap_micros, caught.value.held_micros) == (500, 400)
    ledger.release("r1")
    ledger.place_hold("alice", "r2", 500)


def test_release_is_idempotent(ledger: Ledger) -> None:
    ledger.create_user("alice", budget_micros=1_000)
    ledger.place_hold("alice", "r1", 300)
    assert ledger.release("r1", "client went away").state is HoldState.RELEASED
    assert ledger.release("r1", "client went away").state is HoldState.RELEASED
    assert ledger.balance("alice").available_micros == 1_000
    assert [e.kind.value for e in ledger.entries("alice").entries] == ["grant", "hold", "release"]
    with pytest.raises(UnknownRequest, match="'nope'"):
        ledger.release("nope")
    hold = get_hold(ledger, "r1")
    assert hold is not None and hold.state is HoldState.RELEASED
    assert get_hold(ledger, "nope") is None


def test_expire_holds_releases_only_stale_open_holds(timed_ledger: Ledger, clock: Clock) -> None:
    ledger = timed_ledger
    ledger.create_user("alice", budget_micros=1_000)
    ledger.place_hold("alice", "old", 100)
    ledger.place_hold("alice", "done", 100)
    ledger.release("done")
    clock.advance(minutes=30)
    ledger.place_hold("alice", "new", 100)
    clock.advance(minutes=31)
    assert ledger.expire_holds(max_age=timedelta(hours=1)) == 1
    assert ledger.expire_holds(max_age=timedelta(hours=1)) == 0
    states = {rid: get_hold(ledger, rid) for rid in ("old", "done", "new")}
    assert {rid: h.state.value for rid, h in states.items() if h} == {
        "old": "released",
        "done": "released",
        "new": "open",
    }
    assert ledger.balance("alice").held_micros == 100
    assert ledger.reconcile().ok
