"""What a user is willing to spend, and over which horizon."""

from __future__ import annotations

import calendar
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from decimal import Decimal

from ._constants import MICROS_PER_CREDIT
from ._exceptions import ConfigurationError
from ._money import to_micros
from ._types import Money, PacingMode, Period

__all__ = ["Budget", "default_anchor", "period_window"]

_CALENDAR_PERIODS = ("day", "week", "month")


@dataclass(frozen=True)
class Budget:
    """A spend limit over a horizon of auctions or a period of wall-clock time.

    `Budget(total, auctions=T)` is the paper's setting: `total` over the next `T` auctions.
    `Budget(total, period=...)` renews `total` every period (a `timedelta`, or "day", "week" or
    "month" aligned to UTC like the server's ledger); then `auctions`, if given, is the number of
    auctions expected per period, a starting guess the client refines from the rate it sees.

    A client given no Budget paces the user's budget period on the server instead. A Budget is
    a plan of the client's own; its spend is the user's ledger-wide spend since `start`, so
    every process (and every restart) given the same `start` shares the plan.
    """

    total: Money
    auctions: int | None = None
    period: Period | None = None
    pacing: PacingMode = "smooth"
    max_bid: Money | None = None
    """An optional cap on every single bid, in credits."""
    start: datetime | None = None
    """Where the horizon or the first rolling period begins; defaults to when pacing starts."""
    eta0: float = 1.0
    """Scale of the dual step `eta = eta0 / (gamma * sqrt(T))`."""
    total_micros: int = field(init=False, repr=False, compare=False)
    max_bid_micros: int | None = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        total = to_micros(self.total, name="total")
        cap = None if self.max_bid is None else to_micros(self.max_bid, name="max_bid")
        # Amounts are kept as exact Decimals, so budgets written "50" and 50 compare equal.
        object.__setattr__(self, "total", Decimal(total) / MICROS_PER_CREDIT)
        object.__setattr__(self, "total_micros", total)
        if cap is not None:
            object.__setattr__(self, "max_bid", Decimal(cap) / MICROS_PER_CREDIT)
        object.__setattr__(self, "max_bid_micros", cap)
        if self.auctions is None and self.period is None:
            raise ConfigurationError("a Budget needs auctions=T or period=...")
        if self.auctions is not None and self.auctions < 1:
            raise ConfigurationError("auctions must be at least 1")
        if isinstance(self.period, str) and self.period not in _CALENDAR_PERIODS:
            raise ConfigurationError(f"period must be a timedelta or one of {_CALENDAR_PERIODS}")
        if isinstance(self.period, timedelta) and self.period <= timedelta(0):
            raise ConfigurationError("period must be positive")
        if self.pacing not in ("smooth", "asap"):
            raise ConfigurationError("pacing must be 'smooth' or 'asap'")
        if not self.eta0 > 0:
            raise ConfigurationError("eta0 must be positive")
        if self.start is not None and self.start.tzinfo is None:
            raise ConfigurationError("start must be timezone-aware")

    @property
    def is_periodic(self) -> bool:
        """Whether the budget renews every period rather than covering a fixed horizon."""
        return self.period is not None


def default_anchor(period: Period, now: datetime) -> datetime:
    """A period boundary to count windows from: now, or the current UTC calendar period."""
    if isinstance(period, timedelta):
        return now
    return _calendar_floor(period, now)


def period_window(period: Period, anchor: datetime, now: datetime) -> tuple[datetime, datetime]:
    """The `[start, end)` window of `period` containing `now`, counting from boundary `anchor`."""
    if isinstance(period, timedelta):
        steps = max(0, (now - anchor) // period)
        start = anchor + steps * period
        return start, start + period
    # Calendar periods step from the anchor rather than from UTC midnight, so that a
    # server whose periods start at another hour stays the reference once synced.
    start, end = anchor, _calendar_next(period, anchor)
    while now >= end:
        start, end = end, _calendar_next(period, end)
    return start, end


def _calendar_floor(period: str, moment: datetime) -> datetime:
    day = moment.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    if period == "week":
        return day - timedelta(days=day.weekday())
    if period == "month":
        return day.replace(day=1)
    return day


def _calendar_next(period: str, start: datetime) -> datetime:
    if period == "day":
        return start + timedelta(days=1)
    if period == "week":
        return start + timedelta(days=7)
    year, month = (start.year + 1, 1) if start.month == 12 else (start.year, start.month + 1)
    day = min(start.day, calendar.monthrange(year, month)[1])
    return start.replace(year=year, month=month, day=day)
