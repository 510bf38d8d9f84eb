"""The dashboard's aggregates, on both backends: every batch lands in the bucket of its
closing second, charges are matched to their (batch, user), spend adds up per period."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta

from inference_auctions.billing import Ledger
from tests.billing.conftest import Clock
from tests.billing.helpers import batch_of


def _settle_at(
    ledger: Ledger,
    closed_at: datetime,
    batch_id: str,
    bids: list[tuple[str, str, int]],
    charges: dict[str, int],
) -> None:
    for rid, user, bid in bids:
        ledger.place_hold(user, rid, bid)
    batch, requests, charges = batch_of(batch_id, bids, charges)
    ledger.settle_batch(
        dataclasses.replace(batch, closed_at=closed_at, welfare_micros=7), requests, charges
    )


def test_batches_fall_into_the_buckets_of_their_closing_time(
    timed_ledger: Ledger, clock: Clock
) -> None:
    for name in ("alice", "bob"):
        timed_ledger.create_user(name, budget_micros=10_000_000)
    start = clock.now  # 12:00:00, a whole multiple of 15 s
    # Bucket edges: 12:00:00 is in bucket 0, 12:00:14.999 too, 12:00:15 in bucket 1.
    moments = [timedelta(0), timedelta(seconds=14, milliseconds=999), timedelta(seconds=15)]
    moments += [timedelta(minutes=14, seconds=59)]
    for k, offset in enumerate(moments):
        _settle_at(
            timed_ledger,
            start + offset,
            f"b{k}",
            [(f"a{k}", "alice", 500_000), (f"b{k}", "bob", 300_000)],
            {"alice": 100_000 * (k + 1)},
        )
    clock.now = start + timedelta(minutes=14, seconds=59, milliseconds=500)
    market = timed_ledger.market_activity(timedelta(minutes=15), timedelta(seconds=15))
    assert market.since == start and market.until == start + timedelta(minutes=15)
    assert len(market.buckets) == 60
    counts = {k: b.batches for k, b in enumerate(market.buckets) if b.batches}
    assert counts == {0: 2, 1: 1, 59: 1}
    assert market.buckets[0].revenue_micros == 300_000 and market.buckets[0].requests == 4
    assert market.buckets[0].welfare_micros == 14 and market.buckets[0].largest_batch == 2
    assert sum(b.revenue_micros for b in market.buckets) == 1_000_000
    # Charges go to the user who paid them, in the batch where they were paid.
    points = {(p.batch_id, p.user): p for p in market.clearing}
    assert len(points) == 8
    assert [points[(f"b{k}", "alice")].charge_micros for k in range(4)] == [
        100_000,
        200_000,
        300_000,
        400_000,
    ]
    assert all(points[(f"b{k}", "bob")].charge_micros == 0 for k in range(4))
    assert points[("b0", "alice")].best_priority == 1.0
    assert points[("b0", "bob")].best_position == 1
    assert market.clearing[0].batch_id == "b3"  # newest first
    assert all(p.closed_at.tzinfo is not None for p in market.clearing)
    assert [s.user for s in market.spenders] == ["alice"]
    assert market.spenders[0].spent_micros == 1_000_000
    assert market.holds.count == 0


def test_a_periodic_users_spend_series_ends_at_its_period_spend(
    timed_ledger: Ledger, clock: Clock
) -> None:
    timed_ledger.create_user("dora", budget_micros=5_000_000, period="day")
    timed_ledger.create_user("eve", budget_micros=5_000_000)
    for k in range(5):
        clock.advance(minutes=30)
        _settle_at(
            timed_ledger,
            clock.now,
            f"d{k}",
            [(f"d{k}", "dora", 400_000), (f"e{k}", "eve", 100_000)],
            {"dora": 50_000},
        )
    timed_ledger.refund("d2", "dora", "engine failed", 20_000)
    clock.advance(minutes=1)
    account = timed_ledger.account_activity("dora", points=10, recent=3, clearing=10)
    assert account.period_start == datetime(2025, 1, 15, tzinfo=UTC)
    assert account.period_end == datetime(2025, 1, 16, tzinfo=UTC)
    assert account.balance.spent_this_period_micros == 230_000
    series = [p.spent_micros for p in account.spend]
    assert series[0] == 0 and series[-1] == 230_000 and len(series) <= 12
    assert series == sorted(series)
    assert account.spend[-1].at == clock.now
    assert account.requests_total == 5
    assert [r.batch_id for r in account.recent] == ["d4", "d3", "d2"]
    assert account.recent[2].batch_refund_micros == 20_000
    assert all(r.batch_charge_micros == 50_000 for r in account.recent)
    assert len(account.clearing) == 5 and {p.user for p in account.clearing} == {"dora"}
