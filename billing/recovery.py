"""Recovery after a crash: refund requests that were charged but never served.

A server settles a batch before it dispatches it, and refunds a user's charge for the batch
when one of their requests fails at the engine. A server that dies while its requests are at
the engine leaves them `scheduled` and charged; one whose refund could not be written leaves
them `failed` and charged. `refund_unserved` finds both and refunds each such charge once.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import exists, select
from sqlalchemy.orm import Session
from sqlalchemy.sql.expression import Exists

from billing import refunds, request_log
from billing.models import BatchRequest, EntryKind, LedgerEntry, RequestStatus, User
from billing.records import RefundResult

REASON = "not served: the server stopped or its refund failed while the request was at the engine"


def _entry(kind: EntryKind) -> Exists:
    return exists().where(
        LedgerEntry.kind == kind,
        LedgerEntry.batch_id == BatchRequest.batch_id,
        LedgerEntry.user_id == BatchRequest.user_id,
    )


def mark_stale_failed(session: Session, cutoff: datetime, now: datetime) -> list[str]:
    """Mark requests still `scheduled` since before `cutoff` as failed; returns their rids."""
    stale = session.scalars(
        select(BatchRequest.rid).where(
            BatchRequest.status == RequestStatus.SCHEDULED, BatchRequest.updated_at < cutoff
        )
    ).all()
    for rid in stale:
        request_log.complete_request(
            session, rid, status="failed", cached_tokens=None, ttft_ms=None, now=now
        )
    return list(stale)


def refund_failed(session: Session, now: datetime) -> list[RefundResult]:
    """Refund each user's charge in every batch where one of their requests failed unrefunded."""
    owed = session.execute(
        select(BatchRequest.batch_id, User.name)
        .join(User, User.id == BatchRequest.user_id)
        .where(
            BatchRequest.status == RequestStatus.FAILED,
            _entry(EntryKind.CHARGE),
            ~_entry(EntryKind.REFUND),
        )
        .distinct()
        .order_by(BatchRequest.batch_id, User.name)
    ).all()
    return [
        refunds.refund(
            session, batch_id, name, reason=REASON, amount_micros=None, rid=None, now=now
        )
        for batch_id, name in owed
    ]
