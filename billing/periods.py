"""Budget periods: calendar-aligned days, weeks (from Monday) and months in a time zone.

Pure date arithmetic; which period a moment belongs to for a given user (a schedule that
changes at a boundary, a first period that starts mid-day) is `billing.grants`' business.
"""

from __future__ import annotations

import enum
from datetime import UTC, date, datetime, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from inference_auctions.billing.errors import InvalidInput


class Period(enum.StrEnum):
    """How often a budget is granted; `none` is one grant for the user's lifetime."""

    NONE = "none"
    DAY = "day"
    WEEK = "week"
    MONTH = "month"


def parse_period(value: str, field: str = "period") -> Period:
    """Return the `Period` named by `value`, or raise `InvalidInput` listing the choices."""
    try:
        return Period(value)
    except ValueError:
        choices = ", ".join(p.value for p in Period)
        raise InvalidInput(field, f"must be one of {choices}, got {value!r}") from None


def parse_timezone(name: str, field: str = "timezone") -> ZoneInfo:
    """Return the IANA time zone `name`, or raise `InvalidInput`."""
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise InvalidInput(field, f"unknown time zone {name!r}") from None


def require_aware(moment: datetime, field: str) -> datetime:
    """Return `moment` in UTC; a naive datetime is refused because its zone is a guess."""
    if moment.tzinfo is None or moment.utcoffset() is None:
        raise InvalidInput(field, "must be a timezone-aware datetime")
    return moment.astimezone(UTC)


def period_start(moment: datetime, period: Period, tz: ZoneInfo) -> datetime:
    """Start (in UTC) of the calendar day, week or month in `tz` that contains `moment`."""
    if period is Period.NONE:
        raise ValueError("a lifetime budget has no calendar periods")
    local = moment.astimezone(tz)
    day = local.date()
    if period is Period.WEEK:
        day -= timedelta(days=day.weekday())
    elif period is Period.MONTH:
        day = day.replace(day=1)
    return _local_midnight(day, tz)


def next_period_start(moment: datetime, period: Period, tz: ZoneInfo) -> datetime:
    """Start (in UTC) of the calendar day, week or month in `tz` that follows `moment`'s."""
    if period is Period.NONE:
        raise ValueError("a lifetime budget has no calendar periods")
    day = period_start(moment, period, tz).astimezone(tz).date()
    if period is Period.DAY:
        day += timedelta(days=1)
    elif period is Period.WEEK:
        day += timedelta(days=7)
    else:
        day = date(day.year + day.month // 12, day.month % 12 + 1, 1)
    return _local_midnight(day, tz)


def _local_midnight(day: date, tz: ZoneInfo) -> datetime:
    # Where a DST jump skips midnight, zoneinfo resolves it to the instant of the jump, which
    # still lies at or before every moment of that day.
    return datetime(day.year, day.month, day.day, tzinfo=tz).astimezone(UTC)
