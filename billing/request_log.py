"""Settled requests: lookup, and the serving outcome recorded after dispatch.

Request rows describe what happened to a request; they are not money, so unlike ledger entries
they are updated in place.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, CursorResult, select, update
from sqlalchemy.orm import Session

from inference_auctions.billing.driver_sql import Columns, DriverCursor, driver_cursor
from inference_auctions.billing.errors import InvalidInput, RequestNotScheduled, UnknownRequest
from inference_auctions.billing.inputs import ServedInput
from inference_auctions.billing.models import AUCTION_REQUESTS, BatchRequest, RequestStatus, User
from inference_auctions.billing.postings import check_id
from inference_auctions.billing.views import RequestView


def request_view(request: BatchRequest, user_name: str) -> RequestView:
    """The public view of a request row."""
    return RequestView(
        rid=request.rid,
        batch_id=request.batch_id,
        user=user_name,
        position=request.position,
        priority=request.priority,
        bid_micros=request.bid_micros,
        prompt_tokens=request.prompt_tokens,
        cached_tokens=request.cached_tokens,
        ttft_ms=request.ttft_ms,
        status=request.status,
    )


def find_request(session: Session, rid: str) -> RequestView | None:
    """The settled request `rid`, or None when no batch settled it."""
    row = session.execute(
        select(BatchRequest, User.name)
        .join(User, User.id == BatchRequest.user_id)
        .where(BatchRequest.rid == check_id(rid, "rid"))
    ).first()
    return None if row is None else request_view(row[0], row[1])


def complete_request(
    session: Session,
    rid: str,
    *,
    status: str,
    cached_tokens: int | None,
    ttft_ms: float | None,
    now: datetime,
) -> RequestView:
    """Record how a settled request was served: status, cached tokens, time to first token."""
    try:
        new_status = RequestStatus(status)
    except ValueError:
        new_status = None
    if new_status not in (RequestStatus.SERVED, RequestStatus.FAILED):
        raise InvalidInput("status", f"must be 'served' or 'failed', got {status!r}")
    if ttft_ms is not None and (
        isinstance(ttft_ms, bool)
        or not isinstance(ttft_ms, (int, float))
        or not math.isfinite(ttft_ms)
        or ttft_ms < 0
    ):
        raise InvalidInput(
            "ttft_ms", f"must be a non-negative number of milliseconds, got {ttft_ms!r}"
        )
    row = session.execute(
        select(BatchRequest, User.name)
        .join(User, User.id == BatchRequest.user_id)
        .where(BatchRequest.rid == check_id(rid, "rid"))
        .with_for_update(of=BatchRequest)
    ).first()
    if row is None:
        raise UnknownRequest(rid, "no batch settled it")
    request, name = row
    if cached_tokens is not None and (
        isinstance(cached_tokens, bool)
        or not isinstance(cached_tokens, int)
        or not 0 <= cached_tokens <= request.prompt_tokens
    ):
        raise InvalidInput(
            "cached_tokens",
            f"must be an integer in [0, {request.prompt_tokens}], got {cached_tokens!r}",
        )
    request.status = new_status
    request.cached_tokens = cached_tokens
    request.ttft_ms = None if ttft_ms is None else float(ttft_ms)
    request.updated_at = now
    return request_view(request, name)


def finish_scheduled(
    session: Session,
    rid: str,
    *,
    status: RequestStatus,
    cached_tokens: int | None,
    ttft_ms: float | None,
    now: datetime,
    scheduled_before: datetime | None = None,
) -> None:
    """Move a request from `scheduled` to `status`, only if it is still scheduled.

    This conditional write is what makes a served answer and crash recovery exclusive: the
    first to commit wins and the other raises `RequestNotScheduled`. With `scheduled_before`,
    only a request settled before that moment moves (recovery's age threshold).
    """
    check_id(rid, "rid")
    _check_ttft(ttft_ms)
    conditions = [BatchRequest.rid == rid, BatchRequest.status == RequestStatus.SCHEDULED]
    if scheduled_before is not None:
        conditions.append(BatchRequest.updated_at < scheduled_before)
    _check_cached(cached_tokens)
    moved = session.execute(
        update(BatchRequest)
        .where(*conditions)
        .values(
            status=status,
            cached_tokens=cached_tokens,
            ttft_ms=None if ttft_ms is None else float(ttft_ms),
            updated_at=now,
        )
        .execution_options(synchronize_session=False)
    )
    assert isinstance(moved, CursorResult)
    if moved.rowcount == 1:
        return
    current = session.get(BatchRequest, rid, populate_existing=True)
    if current is None:
        raise UnknownRequest(rid, "no batch settled it")
    raise RequestNotScheduled(rid, current.status.value)


# `serve_scheduled` runs for every served request (grouped), straight on the driver
# (`billing.driver_sql`): one conditional UPDATE per request, each telling whether it moved.
_SERVE = (
    "UPDATE auction_requests SET status = ?, cached_tokens = ?, ttft_ms = ?, updated_at = ? "
    "WHERE rid = ? AND status = ? RETURNING rid"
)
_SERVED_BINDS = Columns(
    AUCTION_REQUESTS, ("status", "cached_tokens", "ttft_ms", "updated_at", "rid", "status")
)


_STATUS_OF = "SELECT status FROM auction_requests WHERE rid = ?"
_STATUS = Columns(AUCTION_REQUESTS, ("status",))


def check_served(record: ServedInput) -> None:
    """Validate a served record's fields (`InvalidInput`)."""
    check_id(record.rid, "rid")
    _check_ttft(record.ttft_ms)
    _check_cached(record.cached_tokens)


def _served_row(cursor: DriverCursor, rid: str, record: ServedInput, now: datetime) -> list[Any]:
    ttft = None if record.ttft_ms is None else float(record.ttft_ms)
    values = (RequestStatus.SERVED, record.cached_tokens, ttft, now, rid, RequestStatus.SCHEDULED)
    return _SERVED_BINDS.bind(cursor.dialect)(values)


def serve_one(
    connection: Connection, record: ServedInput, now: datetime, *, again: bool = False
) -> bool:
    """`serve_scheduled` of one record as one statement: on PostgreSQL on a connection in
    autocommit mode, where the statement commits itself, one round trip in all; on SQLite in
    the connection's transaction. `again`: an earlier attempt's connection was lost after the
    statement may have reached the server; if the request is served now, that attempt served
    it (the serving path is the only one that records a request served as it answers), and
    either way the ledger counts it served, so the answer may go."""
    cursor = DriverCursor(connection)
    moved = cursor.execute(_SERVE, _served_row(cursor, record.rid, record, now))
    if moved or not again:
        return bool(moved)
    rows = cursor.execute(_STATUS_OF, [record.rid])
    return bool(rows) and _STATUS.result(cursor.dialect)(rows[0])[0] is RequestStatus.SERVED


def serve_scheduled(session: Session, records: Sequence[ServedInput], now: datetime) -> list[bool]:
    """Move each record's request from `scheduled` to `served`, only if it is still scheduled;
    result i tells whether record i moved it (a repeated rid moves it at most once, with the
    first record's values).

    Each update is conditional on `scheduled` and says whether it moved its row (RETURNING):
    no read before it, so on a database server it costs one round trip. The rows are locked
    by their updates, in rid order, so two of these never wait on each other in a cycle;
    served and failed remain exclusive.
    """
    for record in records:
        check_served(record)
    first: dict[str, int] = {}
    for index, record in enumerate(records):
        first.setdefault(record.rid, index)
    cursor = driver_cursor(session)
    updates = [_served_row(cursor, rid, records[first[rid]], now) for rid in sorted(first)]
    moved = {row[0] for row in cursor.execute_many_returning(_SERVE, updates)}
    return [first[r.rid] == index and r.rid in moved for index, r in enumerate(records)]


def _check_cached(cached_tokens: int | None) -> None:
    if cached_tokens is not None and (
        isinstance(cached_tokens, bool) or not isinstance(cached_tokens, int) or cached_tokens < 0
    ):
        raise InvalidInput(
            "cached_tokens", f"must be a non-negative integer, got {cached_tokens!r}"
        )


def _check_ttft(ttft_ms: float | None) -> None:
    if ttft_ms is not None and (
        isinstance(ttft_ms, bool)
        or not isinstance(ttft_ms, (int, float))
        or not math.isfinite(ttft_ms)
        or ttft_ms < 0
    ):
        raise InvalidInput(
            "ttft_ms", f"must be a non-negative number of milliseconds, got {ttft_ms!r}"
        )
