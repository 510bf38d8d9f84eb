"""The caller's own ledger: balance, entries and summary. Money as integer `*_micros`."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from functools import partial
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query

from billing.records import BalanceView, EntryView, SummaryRow
from server.api.deps import CurrentUser, State
from server.errors import InvalidRequest

router = APIRouter(prefix="/v1/ledger", tags=["ledger"])


def balance_json(view: BalanceView) -> dict[str, Any]:
    """A balance as JSON."""
    return {
        "user": view.user,
        "balance_micros": view.balance_micros,
        "held_micros": view.held_micros,
        "available_micros": view.available_micros,
        "spent_this_period_micros": view.spent_this_period_micros,
        "period": str(view.period),
        "period_start": view.period_start.isoformat() if view.period_start else None,
    }


def entry_json(entry: EntryView) -> dict[str, Any]:
    """A ledger entry as JSON."""
    return {
        "id": entry.id,
        "kind": str(entry.kind),
        "amount_micros": entry.amount_micros,
        "batch_id": entry.batch_id,
        "rid": public_rid(entry.user, entry.request_id),
        "reason": entry.reason,
        "created_at": entry.created_at.isoformat(),
    }


def public_rid(user: str, ledger_rid: str | None) -> str | None:
    """The rid as the client sent it: the ledger keys holds by `user/rid` internally."""
    if ledger_rid is None:
        return None
    return ledger_rid.removeprefix(f"{user}/")


def summary_json(row: SummaryRow) -> dict[str, Any]:
    """One summary row as JSON."""
    return {
        "period_start": row.period_start.isoformat(),
        "granted_micros": row.granted_micros,
        "charged_micros": row.charged_micros,
        "refunded_micros": row.refunded_micros,
        "adjusted_micros": row.adjusted_micros,
        "net_micros": row.net_micros,
        "entries": row.entries,
    }


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
    kind: Literal["grant", "hold", "release", "charge", "refund", "adjustment"] | None = None,
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
    return {"entries": [entry_json(e) for e in page.entries], "next_cursor": page.next_cursor}


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
    return {"by": by, "rows": [summary_json(row) for row in rows]}
