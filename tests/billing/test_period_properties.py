"""Random sequences of holds, settlements, releases, refunds, expiries, rollovers and budget
changes on a random clock walk over period boundaries and DST changes, in several time zones.

After every step, for every user and every budget period: charges minus refunds stay within
what the period was granted and never go below 0, nothing of an ended period is left to spend,
the balance shown agrees with the entries, and the ledger reconciles. Running the rollover job
never changes what a balance shows. The default examples take seconds per backend; set
INFERENCE_AUCTION_LONG_PROPERTIES=1 for the long variant.
"""

from __future__ import annotations

import os
import uuid
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from inference_auctions.billing import HoldState, InsufficientFunds, Ledger, Period
from inference_auctions.billing.periods import next_period_start
from tests.billing.conftest import Clock
from tests.billing.helpers import batch_of, get_hold
from tests.billing.period_checks import check_periods
from tests.db_fixtures import MigratedDatabase

# DST at midnight (Santiago), a 30-minute DST shift (Lord Howe), a quarter-hour offset
# (Kathmandu), and the usual ones.
ZONES = [
    "UTC",
    "America/New_York",
    "Europe/Paris",
    "Asia/Tokyo",
    "America/Santiago",
    "Australia/Lord_Howe",
    "Asia/Kathmandu",
]
# Days just before DST changes, month and year ends, and a leap day.
START_DAYS = [
    datetime(2025, 3, 8, tzinfo=UTC),  # New York springs forward on the 9th
    datetime(2025, 10, 31, tzinfo=UTC),  # New York falls back on Nov 2
    datetime(2025, 3, 29, tzinfo=UTC),  # Paris, the 30th
    datetime(2025, 10, 25, tzinfo=UTC),  # Paris, the 26th
    datetime(2024, 9, 6, tzinfo=UTC),  # Santiago skips midnight on the 8th
    datetime(2025, 4, 4, tzinfo=UTC),  # Santiago repeats 23:00 on the 5th; Lord Howe on the 6th
    datetime(2025, 10, 4, tzinfo=UTC),  # Lord Howe springs forward 30 minutes on the 5th
    datetime(2024, 2, 27, tzinfo=UTC),  # a leap day
    datetime(2025, 12, 30, tzinfo=UTC),  # a year end
]
PERIODS = ["day", "day", "week", "month", "none"]

AMOUNTS = st.sampled_from([0, 10, 40]) | st.integers(1, 40)
SCHEDULES = st.tuples(AMOUNTS, st.sampled_from(PERIODS), st.sampled_from(ZONES))
FAST = settings(
    max_examples=4,
    stateful_step_count=20,
    deadline=None,
    # Every step is several transactions: a failure is reported as found, not shrunk for minutes.
    phases=[Phase.explicit, Phase.reuse, Phase.generate],
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
LONG = settings(FAST, max_examples=60, stateful_step_count=40)


def in_force_boundary(ledger: Ledger, name: str, now: datetime) -> datetime | None:
    """The next boundary of the user's schedule after `now`, as far as the user row tells."""
    info = ledger.get_user(name)
    boundary = (
        None
        if info.period is Period.NONE
        else next_period_start(now, info.period, ZoneInfo(info.timezone))
    )
    if info.pending_from is not None and (boundary is None or info.pending_from < boundary):
        boundary = info.pending_from
    return boundary


def machine_on(db: MigratedDatabase) -> type[RuleBasedStateMachine]:
    """A state machine over fresh users of the database `db` (one pair per example)."""

    class PeriodMachine(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.clock = Clock(START_DAYS[0])
            self.ledger = Ledger(db.engine, clock=self.clock)
            self.tag = uuid.uuid4().hex[:10]
            self.users: list[str] = []
            self.serial = 0
            self.open: dict[str, tuple[str, int]] = {}
            self.charged: dict[tuple[str, str], int] = {}
            self.refunded: dict[tuple[str, str], int] = defaultdict(int)
            self.refunded_whole: set[tuple[str, str]] = set()
            self.rids_of: dict[tuple[str, str], list[str]] = defaultdict(list)
            self.refunded_rids: set[str] = set()

        def new_id(self, kind: str) -> str:
            self.serial += 1
            return f"{kind}-{self.tag}-{self.serial}"

        @initialize(
            day=st.sampled_from(START_DAYS),
            hours=st.integers(0, 72),
            schedules=st.lists(SCHEDULES, min_size=2, max_size=2),
        )
        def create_users(
            self, day: datetime, hours: int, schedules: list[tuple[int, str, str]]
        ) -> None:
            self.clock.now = day + timedelta(hours=hours, seconds=17)
            for k, (amount, period, zone) in enumerate(schedules):
                name = f"u{self.tag}{k}"
                self.ledger.create_user(name, budget_micros=amount, period=period, timezone=zone)
                self.users.append(name)

        # Mostly minutes to hours; now and then several periods at once.
        @rule(minutes=st.integers(1, 240) | st.integers(1, 40 * 24 * 60))
        def wait(self, minutes: int) -> None:
            self.clock.advance(minutes=minutes)

        @rule(k=st.integers(0, 1), seconds=st.integers(-90, 90))
        def near_a_boundary(self, k: int, seconds: int) -> None:
            boundary = in_force_boundary(self.ledger, self.users[k], self.clock.now)
            if boundary is not None:
                self.clock.now = max(self.clock.now, boundary + timedelta(seconds=seconds))

        @rule(
            k=st.integers(0, 1),
            share=st.integers(1, 7),
            before=st.integers(1, 3600),
            after=st.integers(0, 3600),
            settle_share=st.none() | st.integers(0, 4),
        )
        def across_a_boundary(
            self, k: int, share: int, before: int, after: int, settle_share: int | None
        ) -> None:
            # The cases that matter most, made common: money held, or charged and then refunded,
            # while the period ends.
            boundary = in_force_boundary(self.ledger, self.users[k], self.clock.now)
            if boundary is None:
                return
            self.clock.now = max(self.clock.now, boundary - timedelta(seconds=before))
            rid = self.place_hold(k, share)
            if rid is not None and settle_share is not None:
                name, amount = self.open.pop(rid)
                batch_id = self.new_id("b")
                charge = amount * settle_share // 4
                self.ledger.settle_batch(*batch_of(batch_id, [(rid, name, amount)], {name: charge}))
                self.rids_of[(batch_id, name)].append(rid)
                self.charged[(batch_id, name)] = charge
            self.clock.now = max(self.clock.now, boundary + timedelta(seconds=after))

        @rule(k=st.integers(0, 1), share=st.integers(0, 10))
        def hold(self, k: int, share: int) -> None:
            self.place_hold(k, share)

        def place_hold(self, k: int, share: int) -> str | None:
            name = self.users[k]
            rid = self.new_id("r")
            view = self.ledger.balance(name)
            available = view.available_micros
            # A share of what is available (all of it often), or one micro-credit too much.
            amount = available + 1 if share == 10 else available * min(share, 7) // 7
            if amount > available:
                with pytest.raises(InsufficientFunds):
                    self.ledger.place_hold(name, rid, amount)
                return None
            self.ledger.place_hold(name, rid, amount)
            self.open[rid] = (name, amount)
            # The hold belongs to the period the clock is in, whether or not it was opened.
            entry = self.ledger.entries(name, kind="hold", limit=1000).entries[-1]
            assert (entry.request_id, entry.period_start) == (rid, view.period_start)
            return rid

        @precondition(lambda self: bool(self.open))
        @rule(data=st.data())
        def settle(self, data: st.DataObject) -> None:
            rids = data.draw(
                st.lists(st.sampled_from(sorted(self.open)), min_size=1, max_size=4, unique=True)
            )
            bids = [(rid, *self.open[rid]) for rid in rids]
            held: dict[str, int] = defaultdict(int)
            for _, name, amount in bids:
                held[name] += amount
            charges = {name: data.draw(st.integers(0, total)) for name, total in held.items()}
            batch_id = self.new_id("b")
            self.ledger.settle_batch(*batch_of(batch_id, bids, charges))
            for rid, name, _ in bids:
                del self.open[rid]
                self.rids_of[(batch_id, name)].append(rid)
            for name, charge in charges.items():
                self.charged[(batch_id, name)] = charge

        @precondition(lambda self: bool(self.open))
        @rule(data=st.data())
        def release(self, data: st.DataObject) -> None:
            rid = data.draw(st.sampled_from(sorted(self.open)))
            self.ledger.release(rid, "client disconnected")
            del self.open[rid]

        @rule(minutes=st.integers(1, 36 * 60))
        def expire(self, minutes: int) -> None:
            self.ledger.expire_holds(max_age=timedelta(minutes=minutes))
            for rid in list(self.open):
                hold = get_hold(self.ledger, rid)
                assert hold is not None
                if hold.state is not HoldState.OPEN:
                    del self.open[rid]

        @precondition(lambda self: any(c > self.refunded[k] for k, c in self.charged.items()))
        @rule(data=st.data())
        def refund(self, data: st.DataObject) -> None:
            owed = sorted(k for k, c in self.charged.items() if c > self.refunded[k])
            batch_id, name = key = data.draw(st.sampled_from(owed))
            amount = data.draw(st.integers(1, self.charged[key] - self.refunded[key]))
            if key not in self.refunded_whole:
                result = self.ledger.refund(batch_id, name, "engine failed", amount)
                self.refunded_whole.add(key)
            else:
                rids = [r for r in self.rids_of[key] if r not in self.refunded_rids]
                if not rids:
                    return
                rid = data.draw(st.sampled_from(rids))
                result = self.ledger.refund(batch_id, name, "engine failed", amount, rid=rid)
                self.refunded_rids.add(rid)
            assert result.amount_micros == amount
            self.refunded[key] += amount

        @rule()
        def rollover_job(self) -> None:
            before = [self.ledger.balance(name) for name in self.users]
            self.ledger.rollover()
            assert [self.ledger.balance(name) for name in self.users] == before

        @rule(
            k=st.integers(0, 1),
            amount=st.none() | AMOUNTS,
            period=st.none() | st.sampled_from(PERIODS),
            zone=st.none() | st.sampled_from(ZONES),
        )
        def change_budget(
            self, k: int, amount: int | None, period: str | None, zone: str | None
        ) -> None:
            name = self.users[k]
            old = self.ledger.get_user(name)
            available = self.ledger.balance(name).available_micros
            info = self.ledger.set_budget(name, budget_micros=amount, period=period, timezone=zone)
            if info.pending_from is None and info.period is Period.NONE:
                return  # a lifetime amount changes at once
            assert info.pending_from is None or info.pending_from > self.clock.now
            if old.pending_from is None and old.period is not Period.NONE and info.pending_from:
                # The change waits for the next boundary of the schedule in force.
                assert info.pending_from == next_period_start(
                    self.clock.now, old.period, ZoneInfo(old.timezone)
                )
            assert self.ledger.balance(name).available_micros == available

        @invariant()
        def periods_hold(self) -> None:
            for name in self.users:
                check_periods(self.ledger, name, reconcile=False, now=self.clock.now)
            assert self.ledger.reconcile().ok

    return PeriodMachine


def test_period_rules_hold_for_random_sequences(ledger_db: MigratedDatabase) -> None:
    run_state_machine_as_test(machine_on(ledger_db), settings=FAST)


@pytest.mark.slow
@pytest.mark.skipif(
    os.environ.get("INFERENCE_AUCTION_LONG_PROPERTIES") != "1",
    reason="long variant; set INFERENCE_AUCTION_LONG_PROPERTIES=1",
)
def test_period_rules_hold_for_many_long_sequences(ledger_db: MigratedDatabase) -> None:
    run_state_machine_as_test(machine_on(ledger_db), settings=LONG)
