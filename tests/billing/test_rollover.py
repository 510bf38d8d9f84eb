from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from inference_auctions.billing import EntryKind, Ledger
from inference_auctions.billing.jobs import run_hold_expiry, run_reconcile, run_rollover
from tests.billing.conftest import Clock
from tests.db_fixtures import MigratedDatabase


def kinds(ledger: Ledger, name: str) -> list[tuple[str, int]]:
    return [(e.kind.value, e.amount_micros) for e in ledger.entries(name).entries]


def test_each_period_starts_with_exactly_the_budget(timed_ledger: Ledger, clock: Clock) -> None:
    ledger = timed_ledger
    ledger.create_user("alice", budget_micros=1_000, period="day")
    ledger.place_hold("alice", "r1", 300)
    ledger.release("r1")
    ledger.adjust("alice", -100, reason="correction")
    assert ledger.balance("alice").available_micros == 900
    assert ledger.rollover().granted == []  # still the same day
    clock.advance(days=1)
    assert ledger.rollover().granted == ["alice"]
    assert ledger.balance("alice").available_micros == 1_000
    assert kinds(ledger, "alice")[-2:] == [("adjustment", -900), ("grant", 1_000)]
    assert ledger.reconcile().ok


def test_rollover_run_twice_grants_once(timed_ledger: Ledger, clock: Clock) -> None:
    ledger = timed_ledger
    ledger.create_user("alice", budget_micros=1_000, period="week")
    clock.advance(days=7)
    assert ledger.rollover().granted == ["alice"]
    assert ledger.rollover().granted == []
    grants = ledger.entries("alice", kind="grant").entries
    assert [g.amount_micros for g in grants] == [1_000, 1_000]


def test_rollover_is_calendar_aligned_in_the_budget_zone(ledger: Ledger) -> None:
    ledger.create_user("tokyo", budget_micros=10, period="day", timezone="Asia/Tokyo")
    created = ledger.get_user("tokyo").created_at
    # The Tokyo day after creation starts at 15:00 UTC.
    local_day = created.astimezone(ZoneInfo("Asia/Tokyo")).date()
    next_day = datetime(local_day.year, local_day.month, local_day.day, 15, tzinfo=UTC)
    assert ledger.rollover(next_day.replace(hour=14, minute=59)).granted == []
    assert ledger.rollover(next_day).granted == ["tokyo"]


def test_held_funds_stay_held_over_the_boundary_and_expire_when_released(
    timed_ledger: Ledger, clock: Clock
) -> None:
    ledger = timed_ledger
    ledger.create_user("alice", budget_micros=1_000, period="day")
    ledger.place_hold("alice", "r1", 400)
    clock.advance(days=1)
    ledger.rollover()
    view = ledger.balance("alice")
    assert (view.balance_micros, view.held_micros, view.available_micros) == (1_400, 400, 1_000)
    ledger.release("r1")
    assert ledger.balance("alice").available_micros == 1_000
    assert kinds(ledger, "alice")[-2:] == [("release", -400), ("adjustment", -400)]
    assert ledger.reconcile().ok


def test_lifetime_budgets_and_disabled_users_are_not_rolled_over(
    timed_ledger: Ledger, clock: Clock
) -> None:
    ledger = timed_ledger
    ledger.create_user("once", budget_micros=1_000)
    ledger.create_user("off", budget_micros=1_000, period="day")
    ledger.disable_user("off")
    clock.advance(days=40)
    assert ledger.rollover().granted == []
    ledger.enable_user("off")
    assert ledger.rollover().granted == ["off"]


def test_a_manual_grant_adds_to_the_current_period_once(timed_ledger: Ledger, clock: Clock) -> None:
    ledger = timed_ledger
    ledger.create_user("alice", budget_micros=1_000, period="day")
    clock.advance(days=1)
    today = datetime(2025, 1, 16, tzinfo=UTC)
    entry = ledger.grant("alice", today, 5_000, reason="launch day")
    assert entry.period_start == today
    assert ledger.grant("alice", today, 5_000).id == entry.id  # idempotent
    assert ledger.rollover().granted == []  # the grant opened the period first
    assert ledger.balance("alice").available_micros == 6_000
    clock.advance(days=1)
    assert ledger.rollover().granted == ["alice"]
    assert ledger.balance("alice").available_micros == 1_000


def test_a_budget_change_applies_from_the_next_period(timed_ledger: Ledger, clock: Clock) -> None:
    ledger = timed_ledger
    ledger.create_user("alice", budget_micros=1_000, period="day")
    ledger.set_budget("alice", budget_micros=2_000)
    assert ledger.balance("alice").balance_micros == 1_000
    clock.advance(days=1)
    ledger.rollover()
    assert ledger.balance("alice").balance_micros == 2_000


JOBS: dict[str, Callable[[Ledger], None]] = {
    "rollover": run_rollover,
    "hold expiry": lambda ledger: run_hold_expiry(ledger, timedelta(hours=1)),
    "reconcile": run_reconcile,
}


@pytest.mark.parametrize("job", list(JOBS))
def test_two_replicas_running_a_job_at_once_do_it_once(
    ledger_db: MigratedDatabase, clock: Clock, job: str
) -> None:
    setup = Ledger(ledger_db.engine, clock=clock)
    names = [f"user{k}" for k in range(6)]
    for name in names:
        setup.create_user(name, budget_micros=1_000, period="day")
        setup.place_hold(name, f"{name}-r", 100)
    clock.advance(days=1, hours=2)
    # Each replica has its own engine (its own connections), as separate processes would.
    replicas = [Ledger(ledger_db.new_engine(), clock=clock) for _ in range(2)]
    barrier = threading.Barrier(len(replicas))
    errors: list[BaseException] = []

    def run(replica: Ledger) -> None:
        try:
            barrier.wait()
            JOBS[job](replica)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(r,)) for r in replicas]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    for name in names:
        entries = setup.entries(name).entries
        grants = [e for e in entries if e.kind is EntryKind.GRANT]
        releases = [e for e in entries if e.kind is EntryKind.RELEASE]
        # Releasing a hold opens the user's new period too: the ledger does not wait for the job.
        assert len(grants) == (1 if job == "reconcile" else 2)
        assert len(releases) == (1 if job == "hold expiry" else 0)
    assert setup.reconcile().ok
