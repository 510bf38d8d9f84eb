"""The budget-period rules, checked from a user's entries through the public API."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime

from inference_auctions.billing import EntryKind, EntryView, Ledger

HELD_KINDS = {EntryKind.HOLD, EntryKind.RELEASE}


@dataclass
class PeriodTotals:
    """What one budget period was granted, charged and refunded, and what is left of it."""

    granted: int = 0
    charged: int = 0
    refunded: int = 0
    # Balance entries minus held entries: the period's own available funds.
    available: int = 0

    @property
    def spent(self) -> int:
        """Charges minus refunds counted in the period."""
        return self.charged - self.refunded


def all_entries(ledger: Ledger, name: str) -> list[EntryView]:
    """Every entry of the user, oldest first."""
    entries: list[EntryView] = []
    cursor = None
    while True:
        page = ledger.entries(name, limit=1000, cursor=cursor)
        entries.extend(page.entries)
        if page.next_cursor is None:
            return entries
        cursor = page.next_cursor


def period_totals(ledger: Ledger, name: str) -> dict[datetime, PeriodTotals]:
    """The user's entries summed per budget period."""
    totals: dict[datetime, PeriodTotals] = defaultdict(PeriodTotals)
    for entry in all_entries(ledger, name):
        assert entry.period_start is not None, entry
        period = totals[entry.period_start]
        if entry.kind is EntryKind.GRANT:
            period.granted += entry.amount_micros
        elif entry.kind is EntryKind.CHARGE:
            period.charged -= entry.amount_micros
        elif entry.kind is EntryKind.REFUND:
            period.refunded += entry.amount_micros
        held = entry.kind in HELD_KINDS
        period.available += -entry.amount_micros if held else entry.amount_micros
    return dict(totals)


def check_periods(
    ledger: Ledger, name: str, *, reconcile: bool = True, now: datetime | None = None
) -> dict[datetime, PeriodTotals]:
    """Assert the period rules for one user (and a clean reconciliation); return the totals."""
    totals = period_totals(ledger, name)
    for start, period in totals.items():
        # A period's spending power is its grant; refunds never exceed its charges.
        assert 0 <= period.spent <= period.granted, (start, period)
    latest = max(totals, default=None)
    for start, period in totals.items():
        # Nothing of an ended period is left to spend: it expired or is still held.
        assert start == latest or period.available == 0, (start, period)
    view = ledger.balance(name)
    assert view.available_micros >= 0 and view.spent_this_period_micros >= 0
    if now is not None:
        # The period shown is the one the clock is in.
        assert view.period_start <= now, (view, now)
        assert view.period_end is None or now < view.period_end, (view, now)
    if view.period_start in totals:
        current = totals[view.period_start]
        assert view.period_start == latest
        assert view.spent_this_period_micros == current.spent
        assert view.available_micros == current.available
    else:
        assert view.spent_this_period_micros == 0
    if reconcile:
        assert ledger.reconcile().ok
    return totals
