"""Budget validation and period windows."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from inference_auctions.sdk import Budget, ConfigurationError
from inference_auctions.sdk._budget import default_anchor, period_window


def test_budget_converts_money_exactly() -> None:
    budget = Budget(total="50", auctions=1000, max_bid="0.5")
    assert budget.total_micros == 50_000_000
    assert budget.max_bid_micros == 500_000
    assert not budget.is_periodic


@pytest.mark.parametrize(
    "kwargs",
    [
        {"total": "1"},
        {"total": "1", "auctions": 0},
        {"total": "1", "period": "year"},
        {"total": "1", "period": timedelta(0)},
        {"total": "1", "auctions": 5, "pacing": "fast"},
        {"total": "1", "auctions": 5, "eta0": 0.0},
        {"total": "1", "auctions": 5, "start": datetime(2030, 1, 1)},
    ],
)
def test_budget_rejects_inconsistent_settings(kwargs: dict[str, object]) -> None:
    with pytest.raises(ConfigurationError):
        Budget(**kwargs)  # type: ignore[arg-type]


def test_rolling_window_counts_from_the_anchor() -> None:
    anchor = datetime(2030, 1, 1, 12, tzinfo=UTC)
    now = anchor + timedelta(hours=5, minutes=30)
    start, end = period_window(timedelta(hours=2), anchor, now)
    assert (start, end) == (anchor + timedelta(hours=4), anchor + timedelta(hours=6))


def test_calendar_windows_follow_utc_days_weeks_and_months() -> None:
    now = datetime(2030, 1, 31, 15, tzinfo=UTC)  # a Thursday
    day = period_window("day", default_anchor("day", now), now)
    assert day == (datetime(2030, 1, 31, tzinfo=UTC), datetime(2030, 2, 1, tzinfo=UTC))
    week = period_window("week", default_anchor("week", now), now)
    assert week == (datetime(2030, 1, 28, tzinfo=UTC), datetime(2030, 2, 4, tzinfo=UTC))
    month = period_window("month", default_anchor("month", now), now)
    assert month == (datetime(2030, 1, 1, tzinfo=UTC), datetime(2030, 2, 1, tzinfo=UTC))
    december = datetime(2030, 12, 5, tzinfo=UTC)
    assert period_window("month", datetime(2030, 11, 1, tzinfo=UTC), december) == (
        datetime(2030, 12, 1, tzinfo=UTC),
        datetime(2031, 1, 1, tzinfo=UTC),
    )


def test_calendar_window_keeps_a_server_anchor() -> None:
    # A server whose days start at 06:00 UTC stays the reference.
    anchor = datetime(2030, 1, 1, 6, tzinfo=UTC)
    now = datetime(2030, 1, 3, 5, tzinfo=UTC)
    assert period_window("day", anchor, now) == (
        datetime(2030, 1, 2, 6, tzinfo=UTC),
        datetime(2030, 1, 3, 6, tzinfo=UTC),
    )
