"""Replicas on one ledger sell priority the same way: each announces its pricing, and one
that finds a live replica announcing another refuses to start.

A replica writes its row (`announce`) at start and renews it while it runs; a row not renewed
for `live_seconds` belongs to a replica that is gone (stopped, or crashed without removing
it), and no longer counts. A replica removes its own row when it stops (`withdraw`).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from inference_auctions.billing.models import ReplicaPricing


@dataclass(frozen=True, slots=True)
class AnnouncedPricing:
    """Another live replica's pricing, and when it last renewed it."""

    replica: str
    signature: str
    seen_at: datetime


def announce(session: Session, replica: str, signature: str, now: datetime) -> None:
    """Write (or renew) `replica`'s pricing."""
    row = session.get(ReplicaPricing, replica)
    if row is None:
        session.add(ReplicaPricing(replica=replica, signature=signature, seen_at=now))
    else:
        row.signature, row.seen_at = signature, now


def disagreeing(
    session: Session, replica: str, signature: str, now: datetime, live_seconds: float
) -> list[AnnouncedPricing]:
    """The other replicas renewed within `live_seconds` whose pricing is not `signature`."""
    since = now - timedelta(seconds=live_seconds)
    rows = session.scalars(
        select(ReplicaPricing)
        .where(ReplicaPricing.replica != replica, ReplicaPricing.seen_at >= since)
        .where(ReplicaPricing.signature != signature)
        .order_by(ReplicaPricing.replica)
    ).all()
    return [AnnouncedPricing(row.replica, row.signature, row.seen_at) for row in rows]


def withdraw(session: Session, replica: str) -> None:
    """Remove `replica`'s row: it no longer runs."""
    session.execute(delete(ReplicaPricing).where(ReplicaPricing.replica == replica))
