from __future__ import annotations

from datetime import UTC, datetime
from zoneinfo import ZoneInfo

import pytest

from inference_auctions.billing.errors import InvalidInput
from inference_auctions.billing.periods import (
    Period,
    parse_period,
    parse_timezone,
    period_start,
    require_aware,
)


def utc(year: int, month: int, day: int, hour: int = 0, minute: int = 0) -> datetime:
    return datetime(year, month, day, hour, minute, tzinfo=UTC)


@pytest.mark.parametrize(
    ("period", "tz", "moment", "start"),
    [
        (Period.DAY, "UTC", utc(2025, 1, 15, 12), utc(2025, 1, 15)),
        # 01:30 UTC is still the previous evening in New York (UTC-5).
        (Period.DAY, "America/New_York", utc(2025, 1, 15, 1, 30), utc(2025, 1, 14, 5)),
        (Period.WEEK, "UTC", utc(2025, 1, 15, 12), utc(2025, 1, 13)),  # Monday
        (Period.WEEK, "UTC", utc(2025, 1, 13), utc(2025, 1, 13)),
        (Period.MONTH, "Asia/Tokyo", utc(2025, 1, 31, 16), utc(2025, 1, 31, 15)),  # Feb 1 JST
        (Period.MONTH, "Europe/Paris", utc(2025, 3, 31, 12), utc(2025, 2, 28, 23)),
        # The day after the spring DST change in Paris starts at 22:00 UTC, not 23:00.
        (Period.DAY, "Europe/Paris", utc(2025, 3, 31, 12), utc(2025, 3, 30, 22)),
    ],
)
def test_period_start_is_calendar_aligned_in_the_zone(
    period: Period, tz: str, moment: datetime, start: datetime
) -> None:
    assert period_start(moment, period, ZoneInfo(tz)) == start


def test_a_midnight_skipped_by_dst_resolves_to_the_jump() -> None:
    # Santiago skipped 2024-09-08 00:00 local: clocks went from 00:00 to 01:00.
    start = period_start(utc(2024, 9, 8, 12), Period.DAY, ZoneInfo("America/Santiago"))
    assert start <= utc(2024, 9, 8, 12)
    assert start.astimezone(ZoneInfo("America/Santiago")).date().isoformat() == "2024-09-08"


def test_bad_period_timezone_and_naive_times_are_refused() -> None:
    with pytest.raises(InvalidInput, match="period: must be one of none, day, week, month"):
        parse_period("year")
    with pytest.raises(InvalidInput, match="unknown time zone 'Mars/Olympus'"):
        parse_timezone("Mars/Olympus")
    with pytest.raises(InvalidInput, match="since: must be a timezone-aware datetime"):
        require_aware(datetime(2025, 1, 1), "since")
