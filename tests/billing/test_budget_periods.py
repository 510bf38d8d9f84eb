"""Budget periods: a period's spending power is its grant, whatever is held at the boundary.

One test per numbered finding of issue 12's audit ("Item N", daily budget of 10 credits), on
SQLite and PostgreSQL; the random sequences are in `test_period_properties.py`.
"""

from __future__ import annotations

import dataclasses
import json
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from click.testing import CliRunner

from inference_auctions.billing import (
    EntryKind,
    InsufficientFunds,
    InvalidInput,
    Ledger,
    Period,
    migrate,
)
from inference_auctions.billing.money import MAX_MICROS
from inference_auctions.server.cli.ledger_commands import budget, rollover
from tests.billing.conftest import Clock
from tests.billing.helpers import batch_of, get_hold, hold_and_settle
from tests.billing.period_checks import check_periods, period_totals
from tests.db_fixtures import MigratedDatabase

TEN = 10_000_000
DOCS = Path(__file__).resolve().parents[2] / "docs"


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)


def settle_alone(ledger: Ledger, batch_id: str, rid: str, user: str, charge: int) -> None:
    """Settle one open hold as a batch of its own (the hold is already placed)."""
    hold = get_hold(ledger, rid)
    assert hold is not None
    ledger.settle_batch(*batch_of(batch_id, [(rid, user, hold.amount_micros)], {user: charge}))


def test_held_money_does_not_carry_over_five_days(timed_ledger: Ledger, clock: Clock) -> None:
    """Item 1: everything held over each midnight, then freed every way there is."""
    ledger = timed_ledger
    clock.now = utc(2025, 1, 15, 23, 59)
    ledger.create_user("hoarder", budget_micros=TEN, period="day")
    available = []
    for day, how in enumerate(["release", "settle for less", "expire", "settle at 0", "release"]):
        rid = f"held-{day}"
        ledger.place_hold("hoarder", rid, ledger.balance("hoarder").available_micros)
        clock.advance(minutes=2)  # 00:01, the rollover job has not run
        if how == "release":
            ledger.release(rid, "client disconnected")
        elif how == "expire":
            assert ledger.expire_holds(max_age=timedelta(seconds=60)) == 1
        else:
            charge = 3_000_000 if how.endswith("less") else 0
            settle_alone(ledger, f"b{day}", rid, "hoarder", charge)
        available.append(ledger.balance("hoarder").available_micros)
        clock.advance(hours=23, minutes=58)
    assert available == [TEN] * 5
    # Then everything in one day: 10 credits, not 60.
    ledger.place_hold("hoarder", "spree", ledger.balance("hoarder").available_micros)
    settle_alone(ledger, "spree", "spree", "hoarder", TEN)
    with pytest.raises(InsufficientFunds):
        ledger.place_hold("hoarder", "more", 1)
    check_periods(ledger, "hoarder")
    assert all(t.spent <= TEN for t in period_totals(ledger, "hoarder").values())


def test_yesterdays_leftover_cannot_be_spent_at_00_00_30(
    timed_ledger: Ledger, clock: Clock
) -> None:
    """Item 2: the boundary is the ledger's, not the job's, which runs only every 60 s."""
    ledger = timed_ledger
    ledger.create_user("early", budget_micros=TEN, period="day")  # 2025-01-15 12:00
    clock.now = utc(2025, 1, 16, 0, 0, 30)
    assert ledger.balance("early").available_micros == TEN  # what opening the day will leave
    ledger.place_hold("early", "r1", TEN)
    with pytest.raises(InsufficientFunds):
        ledger.place_hold("early", "r2", 1)
    settle_alone(ledger, "b1", "r1", "early", TEN)
    clock.now = utc(2025, 1, 16, 0, 1)
    assert ledger.rollover().granted == []  # the hold opened the day already
    with pytest.raises(InsufficientFunds):
        ledger.place_hold("early", "r3", 1)
    totals = period_totals(ledger, "early")
    assert totals[utc(2025, 1, 16)].spent == TEN
    assert totals[utc(2025, 1, 15)].spent == 0
    check_periods(ledger, "early")


def test_a_timezone_change_waits_for_the_boundary_of_the_old_zone(
    timed_ledger: Ledger, clock: Clock
) -> None:
    """Item 3: UTC -> Tokyo at noon opens no extra period at Tokyo's midnight (15:00Z)."""
    ledger = timed_ledger
    ledger.create_user("zone", budget_micros=TEN, period="day")
    info = ledger.set_budget("zone", timezone="Asia/Tokyo")
    assert (info.timezone, info.pending_timezone) == ("UTC", "Asia/Tokyo")
    assert info.pending_from == utc(2025, 1, 16)
    spent_by_hour: dict[datetime, int] = {}
    while clock.now < utc(2025, 1, 16, 12):
        clock.advance(minutes=30)
        ledger.rollover()  # the job may run at any time; it must not matter
        available = ledger.balance("zone").available_micros
        if available:
            rid = f"r{clock.now.isoformat()}"
            ledger.place_hold("zone", rid, available)
            settle_alone(ledger, f"b{rid}", rid, "zone", available)
            spent_by_hour[clock.now] = available
    grants = ledger.entries("zone", kind="grant").entries
    assert [g.period_start for g in grants] == [utc(2025, 1, 15), utc(2025, 1, 16)]
    assert sum(v for k, v in spent_by_hour.items() if k >= utc(2025, 1, 16)) == TEN
    # The first Tokyo day runs from the change to the next Tokyo midnight, 15:00Z.
    clock.now = utc(2025, 1, 16, 14, 59)
    view = ledger.balance("zone")
    assert (view.available_micros, view.period_start, view.period_end) == (
        0,
        utc(2025, 1, 16),
        utc(2025, 1, 16, 15),
    )
    clock.now = utc(2025, 1, 16, 15)
    view = ledger.balance("zone")
    assert (view.available_micros, view.period_start, view.period_end) == (
        TEN,
        utc(2025, 1, 16, 15),
        utc(2025, 1, 17, 15),
    )
    assert ledger.get_user("zone").timezone == "Asia/Tokyo"
    check_periods(ledger, "zone")


def test_a_period_change_waits_for_the_boundary_of_the_old_period(
    timed_ledger: Ledger, clock: Clock
) -> None:
    """Item 3: month -> day takes effect at the next month, not at the next job run."""
    ledger = timed_ledger
    ledger.create_user("monthly", budget_micros=30 * TEN, period="month")
    ledger.place_hold("monthly", "r1", TEN)
    info = ledger.set_budget("monthly", budget_micros=TEN, period="day")
    assert info.pending_from == utc(2025, 2, 1)
    clock.advance(days=1)
    assert ledger.rollover().granted == []
    view = ledger.balance("monthly")
    assert (view.period, view.available_micros) == (Period.MONTH, 29 * TEN)
    clock.now = utc(2025, 2, 1, 0, 0, 1)
    ledger.release("r1")  # January's hold: its money expires with January
    view = ledger.balance("monthly")
    assert (view.period, view.period_start, view.available_micros) == (
        Period.DAY,
        utc(2025, 2, 1),
        TEN,
    )
    check_periods(ledger, "monthly")


def test_lifetime_to_daily_keeps_the_lifetime_funds_until_midnight(
    timed_ledger: Ledger, clock: Clock
) -> None:
    """Item 3: lifetime -> day no longer expires a 10,000-credit balance at once."""
    ledger = timed_ledger
    ledger.create_user("saver", budget_micros=1_000 * TEN)
    info = ledger.set_budget("saver", budget_micros=TEN, period="day")
    assert info.pending_from == utc(2025, 1, 16)
    ledger.rollover()
    assert ledger.balance("saver").available_micros == 1_000 * TEN
    clock.now = utc(2025, 1, 16, 0, 0, 1)
    ledger.rollover()
    assert ledger.balance("saver").available_micros == TEN
    check_periods(ledger, "saver")


def test_a_lifetime_budget_set_grants_or_takes_back_the_difference(
    timed_ledger: Ledger, clock: Clock
) -> None:
    """Item 4: `budget set` on a lifetime budget changes the funds at once, by the difference."""
    ledger = timed_ledger
    ledger.create_user("life", budget_micros=TEN)
    hold_and_settle(ledger, "b1", [("r1", "life", 4_000_000)], {"life": 4_000_000})
    assert ledger.set_budget("life", budget_micros=3 * TEN).budget_micros == 3 * TEN
    assert ledger.balance("life").available_micros == 3 * TEN - 4_000_000
    assert ledger.set_budget("life", budget_micros=3 * TEN).pending_from is None
    assert ledger.balance("life").available_micros == 3 * TEN - 4_000_000  # no second grant
    clock.advance(days=365)
    assert ledger.balance("life").available_micros == 3 * TEN - 4_000_000
    ledger.set_budget("life", budget_micros=2 * TEN)
    assert ledger.balance("life").available_micros == 2 * TEN - 4_000_000
    # Lowered below what was spent: all that is left is taken back, never more.
    ledger.set_budget("life", budget_micros=1_000_000)
    assert ledger.balance("life").available_micros == 0
    assert ledger.reconcile().ok


def test_the_cli_says_what_budget_set_does(ledger_db: MigratedDatabase) -> None:
    """Item 4: the CLI's words for a lifetime change and a waiting periodic change."""
    ledger = Ledger(ledger_db.engine)
    ledger.create_user("life", budget_micros=TEN)
    ledger.create_user("daily", budget_micros=TEN, period="day")
    runner = CliRunner()
    url = ["--database-url", ledger_db.url]
    raised = runner.invoke(budget, ["set", "life", "--budget", "30", *url])
    assert raised.exit_code == 0, raised.output
    assert "Granted 20.000000 more credits now." in raised.output
    assert ledger.balance("life").available_micros == 3 * TEN
    waiting = runner.invoke(budget, ["set", "daily", "--budget", "30", *url])
    assert waiting.exit_code == 0, waiting.output
    pending_from = ledger.get_user("daily").pending_from
    assert pending_from is not None
    assert f"From {pending_from.isoformat()} (the next period boundary) on" in waiting.output
    assert "30.000000 credits per day (UTC)" in waiting.output
    assert ledger.balance("daily").available_micros == TEN


def test_a_grant_is_for_the_current_period_only(timed_ledger: Ledger, clock: Clock) -> None:
    """Item 4: a grant for a future period is refused instead of being spendable at once."""
    ledger = timed_ledger
    ledger.create_user("alice", budget_micros=TEN, period="day")
    with pytest.raises(InvalidInput, match=r"period_start: .* has not started"):
        ledger.grant("alice", utc(2025, 1, 16), TEN)
    with pytest.raises(InvalidInput, match=r"period_start: .* has ended"):
        ledger.grant("alice", utc(2025, 1, 14), TEN)
    assert ledger.balance("alice").available_micros == TEN
    ledger.grant("alice", utc(2025, 1, 15), TEN, reason="launch day")
    assert ledger.balance("alice").available_micros == 2 * TEN
    check_periods(ledger, "alice")


def test_a_refund_after_the_rollover_goes_to_the_charged_period(
    timed_ledger: Ledger, clock: Clock
) -> None:
    """Item 5: no 20 credits on a 10-credit day, and no negative spend."""
    ledger = timed_ledger
    clock.now = utc(2025, 1, 15, 23)
    ledger.create_user("alice", budget_micros=TEN, period="day")
    hold_and_settle(ledger, "b1", [("r1", "alice", TEN)], {"alice": TEN})
    clock.now = utc(2025, 1, 16, 0, 30)
    ledger.rollover()
    result = ledger.refund("b1", "alice", "engine failed")
    assert result.amount_micros == TEN
    view = ledger.balance("alice")
    assert (view.available_micros, view.spent_this_period_micros) == (TEN, 0)
    refund = ledger.entries("alice", kind="refund").entries[0]
    assert refund.period_start == utc(2025, 1, 15)
    totals = period_totals(ledger, "alice")
    assert totals[utc(2025, 1, 15)].spent == 0
    # Within the same period a refund gives the money back to spend.
    hold_and_settle(ledger, "b2", [("r2", "alice", TEN)], {"alice": 6_000_000})
    ledger.refund("b2", "alice", "engine failed", 2_000_000)
    view = ledger.balance("alice")
    assert (view.available_micros, view.spent_this_period_micros) == (6_000_000, 4_000_000)
    check_periods(ledger, "alice")


def test_one_batch_with_holds_from_two_periods_charges_each_within_its_holds(
    timed_ledger: Ledger, clock: Clock
) -> None:
    """A hold placed at 23:59 and one at 00:01 clear together; each day pays from its own."""
    ledger = timed_ledger
    clock.now = utc(2025, 1, 15, 23, 59)
    ledger.create_user("alice", budget_micros=TEN, period="day")
    ledger.place_hold("alice", "late", 6_000_000)
    clock.now = utc(2025, 1, 16, 0, 1)
    ledger.place_hold("alice", "early", TEN)
    ledger.settle_batch(
        *batch_of(
            "mixed",
            [("late", "alice", 6_000_000), ("early", "alice", TEN)],
            {"alice": 12_000_000},
        )
    )
    totals = period_totals(ledger, "alice")
    # The older period's holds pay first: all 6 of them, then 6 of today's 10.
    assert (totals[utc(2025, 1, 15)].spent, totals[utc(2025, 1, 16)].spent) == (
        6_000_000,
        6_000_000,
    )
    assert ledger.balance("alice").available_micros == 4_000_000
    ledger.refund("mixed", "alice", "engine failed")
    # Refunded newest period first: today gets its 6 back, yesterday's 6 expire with it.
    view = ledger.balance("alice")
    assert (view.available_micros, view.spent_this_period_micros) == (TEN, 0)
    refunds = ledger.entries("alice", kind="refund").entries
    assert [(r.period_start, r.amount_micros) for r in refunds] == [
        (utc(2025, 1, 16), 6_000_000),
        (utc(2025, 1, 15), 6_000_000),
    ]
    # A retry of the refund finds both parts and refunds nothing more.
    assert ledger.refund("mixed", "alice", "engine failed").amount_micros == 12_000_000
    assert ledger.balance("alice") == view
    check_periods(ledger, "alice")


def test_a_refund_of_a_request_is_not_mistaken_for_another_one(ledger: Ledger) -> None:
    """Split refunds carry `@period` in their keys; a client's rid may contain "@" too."""
    ledger.create_user("alice", budget_micros=TEN)
    twin = "r@2025-01-15T00:00:00.000000Z"
    hold_and_settle(ledger, "b1", [("r", "alice", 5), (twin, "alice", 5)], {"alice": 8})
    assert ledger.refund("b1", "alice", "failed", 3, rid=twin).amount_micros == 3
    assert ledger.refund("b1", "alice", "failed", 4, rid="r").amount_micros == 4
    assert ledger.refund("b1", "alice", "failed", 3, rid=twin).refunded_total_micros == 7
    check_periods(ledger, "alice")


def test_a_ledger_from_before_periods_keeps_working_after_the_upgrade(
    ledger_db: MigratedDatabase, clock: Clock
) -> None:
    """Entries from before the migration count by their time; open holds get their period."""
    ledger = Ledger(ledger_db.engine, clock=clock)
    ledger.create_user("old", budget_micros=TEN, period="day")
    hold_and_settle(ledger, "b1", [("r1", "old", TEN)], {"old": 4_000_000})
    ledger.place_hold("old", "r2", 1_000_000)
    migrate.downgrade(ledger_db.engine, "2e7d5a86b9a5")
    migrate.upgrade(ledger_db.engine)
    assert {e.period_start for e in ledger.entries("old").entries} == {None}
    assert ledger.balance("old").spent_this_period_micros == 4_000_000
    ledger.refund("b1", "old", "engine failed")
    clock.advance(days=1)
    ledger.release("r2")
    view = ledger.balance("old")
    assert (view.available_micros, view.held_micros, view.spent_this_period_micros) == (TEN, 0, 0)
    assert ledger.reconcile().ok


def test_a_batch_total_may_exceed_the_cap_of_one_amount(ledger: Ledger) -> None:
    """Item 6: two charges at the per-amount maximum settle; revenue is twice that."""
    bids = []
    for name in ("big", "bigger"):
        ledger.create_user(name, budget_micros=MAX_MICROS)
        bids.append((f"r-{name}", name, MAX_MICROS))
    charges = {"big": MAX_MICROS, "bigger": MAX_MICROS}
    batch, requests, charges = batch_of("huge", bids, charges)
    batch = dataclasses.replace(batch, welfare_micros=3 * MAX_MICROS)
    assert batch.revenue_micros == 2 * MAX_MICROS
    for request in requests:
        ledger.place_hold(request.user, request.rid, request.bid_micros)
    result = ledger.settle_batch(batch, requests, charges)
    assert result.charges_micros == charges
    assert ledger.balance("big").available_micros == 0
    assert ledger.reconcile().ok


def test_the_docs_say_when_the_job_runs_and_what_an_outage_grants() -> None:
    """Item 7: `ledger rollover --help` and the jobs page agree, and outages are explained."""
    help_text = " ".join(CliRunner().invoke(rollover, ["--help"]).output.split())
    assert "hourly" not in help_text
    assert "ROLLOVER_INTERVAL_SECONDS (60 s by default)" in help_text
    operations = " ".join((DOCS / "operations" / "jobs.md").read_text().split())
    assert "| rollover | `ROLLOVER_INTERVAL_SECONDS`, 60 s (first run 60 s after the start) |" in (
        operations
    )
    assert "An outage of several periods grants only the current one" in operations


def test_entries_name_their_period(timed_ledger: Ledger, clock: Clock) -> None:
    """Every entry written now carries the period it belongs to."""
    ledger = timed_ledger
    ledger.create_user("alice", budget_micros=TEN, period="week", timezone="Europe/Paris")
    ledger.place_hold("alice", "r1", 5)
    entries = ledger.entries("alice").entries
    monday = utc(2025, 1, 12, 23)  # Monday 00:00 in Paris
    assert [(e.kind, e.period_start) for e in entries] == [
        (EntryKind.GRANT, monday),
        (EntryKind.HOLD, monday),
    ]
    exported = json.loads(ledger.export("alice", "json"))
    assert [e["period_start"] for e in exported] == [monday.isoformat()] * 2


def test_replicas_placing_holds_at_the_boundary_open_the_period_once(
    ledger_db: MigratedDatabase, clock: Clock
) -> None:
    """Six replicas' first holds after midnight race to open the day: one expiry, one grant."""
    setup = Ledger(ledger_db.engine, clock=clock)
    setup.create_user("alice", budget_micros=TEN, period="day")
    clock.now = utc(2025, 1, 16, 0, 0, 30)
    replicas = [Ledger(ledger_db.new_engine(), clock=clock) for _ in range(6)]
    barrier = threading.Barrier(len(replicas))
    errors: list[BaseException] = []

    def hold(k: int) -> None:
        try:
            barrier.wait()
            replicas[k].place_hold("alice", f"r{k}", 1_000_000)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=hold, args=(k,)) for k in range(len(replicas))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    grants = setup.entries("alice", kind="grant").entries
    expiries = setup.entries("alice", kind="adjustment").entries
    assert [g.period_start for g in grants] == [utc(2025, 1, 15), utc(2025, 1, 16)]
    assert [(e.amount_micros, e.period_start) for e in expiries] == [(-TEN, utc(2025, 1, 15))]
    assert setup.balance("alice").available_micros == 4_000_000
    check_periods(setup, "alice")
