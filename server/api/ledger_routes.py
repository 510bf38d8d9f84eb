"""The caller's own ledger: balance, entries and summary. Money as integer `*_micros`."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from functools import partial
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query

from inference_auctions.billing import BalanceRecord, BalanceView, EntryRecord, SummaryRecord
from inference_auctions.server.api.deps import CurrentUser, State
from inference_auctions.server.errors import InvalidRequest

EntryKindName = Literal[
    "grant", "hold", "release", "charge", "refund", "adjustment", "fee", "floor"
]

router = APIRouter(prefix="/v1/ledger", tags=["ledger"])


def balance_json(view: BalanceView) -> dict[str, Any]:
    """A balance as JSON: billing's `BalanceRecord`, as the CLI shows it."""
    return BalanceRecord.of(view).as_json()


def _in_utc(moment: datetime | None, field: str) -> datetime | None:
    """An aware `since`/`until` in UTC (a naive one goes on, for the ledger to refuse by name);
    400 when it has no UTC form, as 0001-01-01T00:00:00+01:00 has not."""
    if moment is None or moment.tzinfo is None:
        return moment
    try:
        return moment.astimezone(UTC)
    except OverflowError:
        raise InvalidRequest(
            f"{field}: {moment.isoformat()} is out of range", param=field
        ) from None


@router.get("/balance", summary="My balance")
async def balance(user: CurrentUser, state: State) -> dict[str, Any]:
    """Balance, held, available and this period's spend."""
    return balance_json(await asyncio.to_thread(state.ledger.balance, user.name))


@router.get("/entries", summary="My ledger entries")
async def entries(
    user: CurrentUser,
    state: State,
    since: datetime | None = None,
    until: datetime | None = None,
    kind: EntryKindName | None = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    # An entry id as returned in `next_cursor`: ASCII digits that fit the id column (the
    # ledger's own parser takes any Unicode digit, and a bigint overflow is a database error).
    cursor: Annotated[str | None, Query(max_length=18, pattern=r"^[0-9]+$")] = None,
) -> dict[str, Any]:
    """A page of entries, oldest first; pass `next_cursor` back as `cursor`."""
    query = partial(
        state.ledger.entries,
        user.name,
        since=_in_utc(since, "since"),
        until=_in_utc(until, "until"),
        kind=kind,
        limit=limit,
        cursor=cursor,
    )
    page = await asyncio.to_thread(query)
    return {
        "entries": [EntryRecord.of(e).as_json() for e in page.entries],
        "next_cursor": page.next_cursor,
    }


@router.get("/summary", summary="My spend per day, week or month")
async def summary(
    user: CurrentUser,
    state: State,
    by: Literal["day", "week", "month"] = "day",
    since: datetime | None = None,
    until: datetime | None = None,
) -> dict[str, Any]:
    """Totals per calendar period in the budget's time zone."""
    since, until = _in_utc(since, "since"), _in_utc(until, "until")
    rows = await asyncio.to_thread(state.ledger.summary, user.name, by, since, until)
    return {"by": by, "rows": [SummaryRecord.of(row).as_json() for row in rows]}
