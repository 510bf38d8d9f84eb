"""Read-only figures for pacing clients: spend and auctions since a moment, recent clearing.

Money is integer micro-credits. These queries only read; the period figures themselves
(grant, spent this period) come from `Ledger.balance` and `Ledger.get_user`.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from inference_auctions.billing.models import AuctionBatch, BatchRequest, EntryKind, LedgerEntry
from inference_auctions.billing.periods import require_aware
from inference_auctions.billing.postings import get_user


@dataclass(frozen=True, slots=True)
class SpendView:
    """What a user spent (charges net of refunds) and how many auctions it took part in."""

    since: datetime
    spent_micros: int
    auctions: int


@dataclass(frozen=True, slots=True)
class ClearingSample:
    """One user's place in one cleared batch: its priority (summed over its requests there),
    how many of its requests the batch held, and its charge for the batch."""

    batch_id: str
    closed_at: datetime
    batch_size: int
    requests: int
    priority: float
    charge_micros: int
    user_id: int = 0  # tells users apart (how many a published figure draws on), never named


def spend_since(session: Session, name: str, since: datetime) -> SpendView:
    """Charges and request fees net of refunds booked at or after `since`, and batches the
    user took part in."""
    since = require_aware(since, "since")
    user = get_user(session, name)
    net = session.scalar(
        select(func.coalesce(func.sum(LedgerEntry.amount_micros), 0)).where(
            LedgerEntry.user_id == user.id,
            LedgerEntry.kind.in_(
                [EntryKind.CHARGE, EntryKind.REFUND, EntryKind.FEE, EntryKind.FLOOR]
            ),
            LedgerEntry.created_at >= since,
        )
    )
    return SpendView(
        since=since,
        spent_micros=max(0, -int(net or 0)),
        auctions=auctions_since(session, name, since),
    )


def auctions_since(session: Session, name: str, since: datetime) -> int:
    """Distinct batches closed at or after `since` that held at least one of the user's requests."""
    user = get_user(session, name)
    count = session.scalar(
        select(func.count(func.distinct(BatchRequest.batch_id)))
        .join(AuctionBatch, AuctionBatch.id == BatchRequest.batch_id)
        .where(
            BatchRequest.user_id == user.id,
            AuctionBatch.closed_at >= require_aware(since, "since"),
        )
    )
    return int(count or 0)


def recent_clearing(session: Session, since: datetime, max_batches: int) -> list[ClearingSample]:
    """Every user's priority and charge in the latest `max_batches` batches closed since `since`."""
    batches = session.execute(
        select(AuctionBatch.id, AuctionBatch.closed_at, AuctionBatch.n)
        .where(AuctionBatch.closed_at >= require_aware(since, "since"))
        .order_by(AuctionBatch.closed_at.desc())
        .limit(max_batches)
    ).all()
    return _samples_of(session, list(batches))


def clearing_after(session: Session, after: datetime, limit: int) -> list[ClearingSample]:
    """Every user's priority and charge in the first `limit` batches closed after `after`,
    oldest first (to follow the market as it clears; the closing-time index finds them)."""
    batches = session.execute(
        select(AuctionBatch.id, AuctionBatch.closed_at, AuctionBatch.n)
        .where(AuctionBatch.closed_at > require_aware(after, "after"))
        .order_by(AuctionBatch.closed_at)
        .limit(limit)
    ).all()
    return _samples_of(session, list(batches))


def _samples_of(session: Session, batches: list[Any]) -> list[ClearingSample]:
    if not batches:
        return []
    ids = [batch_id for batch_id, _, _ in batches]
    places: dict[tuple[str, int], list[float]] = defaultdict(list)
    for batch_id, user_id, priority in session.execute(
        select(BatchRequest.batch_id, BatchRequest.user_id, BatchRequest.priority).where(
            BatchRequest.batch_id.in_(ids)
        )
    ):
        places[(batch_id, user_id)].append(float(priority))
    charges: dict[tuple[str, int], int] = defaultdict(int)
    for charged_batch, user_id, amount in session.execute(
        select(LedgerEntry.batch_id, LedgerEntry.user_id, LedgerEntry.amount_micros).where(
            LedgerEntry.batch_id.in_(ids), LedgerEntry.kind == EntryKind.CHARGE
        )
    ):
        assert charged_batch is not None
        charges[(charged_batch, user_id)] -= amount  # charges are booked as negative amounts
    closed = {batch_id: (closed_at, n) for batch_id, closed_at, n in batches}
    return [
        ClearingSample(
            batch_id=batch_id,
            closed_at=closed[batch_id][0],
            batch_size=closed[batch_id][1],
            requests=len(priorities),
            priority=sum(priorities),
            charge_micros=charges.get((batch_id, user_id), 0),
            user_id=user_id,
        )
        for (batch_id, user_id), priorities in places.items()
    ]
