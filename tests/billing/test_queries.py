from __future__ import annotations

import csv
import io
import json
from datetime import UTC, datetime

import pytest

from inference_auctions.billing import EntryKind, InvalidInput, Ledger
from tests.billing.conftest import Clock
from tests.billing.helpers import hold_and_settle


def test_entries_paginate_and_filter(timed_ledger: Ledger, clock: Clock) -> None:
    ledger = timed_ledger
    ledger.create_user("alice", budget_micros=10_000)
    for k in range(7):
        clock.advance(hours=1)
        ledger.place_hold("alice", f"r{k}", 10)
    seen, cursor = [], None
    while True:
        page = ledger.entries("alice", limit=3, cursor=cursor)
        seen.extend(page.entries)
        if page.next_cursor is None:
            break
        cursor = page.next_cursor
    assert len(seen) == 8 and [e.id for e in seen] == sorted(e.id for e in seen)
    holds = ledger.entries("alice", kind=EntryKind.HOLD).entries
    assert [e.request_id for e in holds] == [f"r{k}" for k in range(7)]
    window = ledger.entries(
        "alice",
        since=datetime(2025, 1, 15, 14, tzinfo=UTC),
        until=datetime(2025, 1, 15, 16, tzinfo=UTC),
    ).entries
    assert [e.request_id for e in window] == ["r1", "r2"]


def test_summary_buckets_by_calendar_period_in_the_users_zone(
    timed_ledger: Ledger, clock: Clock
) -> None:
    ledger = timed_ledger
    ledger.create_user("alice", budget_micros=10_000, timezone="America/New_York")
    hold_and_settle(ledger, "b1", [("r1", "alice", 500)], {"alice": 200})
    clock.advance(hours=12)  # 2025-01-16 00:00 UTC is still the 15th in New York
    hold_and_settle(ledger, "b2", [("r2", "alice", 500)], {"alice": 300})
    ledger.refund("b2", "alice", "failed", 100)
    clock.advance(days=1)
    ledger.adjust("alice", -50, reason="fee")
    days = ledger.summary("alice", by="day")
    assert [(r.period_start.isoformat(), r.charged_micros) for r in days] == [
        ("2025-01-15T05:00:00+00:00", 500),
        ("2025-01-16T05:00:00+00:00", 0),
    ]
    first = days[0]
    assert (first.granted_micros, first.refunded_micros, first.net_micros) == (10_000, 100, 9_600)
    assert days[1].adjusted_micros == -50
    (month,) = ledger.summary("alice", by="month")
    assert month.net_micros == ledger.balance("alice").balance_micros
    assert ledger.balance("alice").spent_this_period_micros == 400


def test_export_json_and_csv_carry_integer_micros(ledger: Ledger) -> None:
    ledger.create_user("alice", budget_micros=1_500_000)
    ledger.create_user("bob", budget_micros=7)
    hold_and_settle(ledger, "b1", [("r1", "alice", 500_000)], {"alice": 123_456})
    records = json.loads(ledger.export("alice", "json"))
    assert [(r["kind"], r["amount_micros"]) for r in records] == [
        ("grant", 1_500_000),
        ("hold", 500_000),
        ("release", -500_000),
        ("charge", -123_456),
    ]
    assert all(isinstance(r["amount_micros"], int) for r in records)
    rows = list(csv.DictReader(io.StringIO(ledger.export(None, "csv"))))
    assert {r["user"] for r in rows} == {"alice", "bob"}
    assert sum(int(r["amount_micros"]) for r in rows if r["user"] == "alice") == 1_500_000 - 123_456


def test_balance_reports_the_period(timed_ledger: Ledger) -> None:
    timed_ledger.create_user("alice", budget_micros=100, period="month", timezone="Europe/Paris")
    view = timed_ledger.balance("alice")
    assert view.period.value == "month"
    assert view.period_start == datetime(2024, 12, 31, 23, tzinfo=UTC)


def test_a_cursor_that_no_page_returned_is_refused_by_name(ledger: Ledger) -> None:
    ledger.create_user("alice", budget_micros=10)
    for cursor in ("²", "1" * 19, "-1", "abc"):
        with pytest.raises(InvalidInput, match=r"^cursor: is not a cursor"):
            ledger.entries("alice", cursor=cursor)
