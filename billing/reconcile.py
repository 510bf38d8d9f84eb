"""Reconciliation: every balance row must equal the sum of its user's entries.

`balance_micros` must equal the sum of grant, charge, refund, adjustment and fee entries;
`held_micros` the sum of hold and release entries, and also the total of the open holds.
One statement reads all three, so on PostgreSQL it sees a single snapshot even while
settlements run.
"""

from __future__ import annotations

from sqlalchemy import case, func, select
from sqlalchemy.orm import Session

from inference_auctions.billing.models import (
    BALANCE_KINDS,
    Balance,
    Hold,
    HoldState,
    LedgerEntry,
    User,
)
from inference_auctions.billing.views import DriftView, ReconcileView


def reconcile(session: Session) -> ReconcileView:
    """Compare every balance row with its entries and open holds; report each disagreement."""
    sums = (
        select(
            LedgerEntry.user_id.label("user_id"),
            func.sum(
                case((LedgerEntry.kind.in_(BALANCE_KINDS), LedgerEntry.amount_micros), else_=0)
            ).label("balance"),
            func.sum(
                case((LedgerEntry.kind.in_(BALANCE_KINDS), 0), else_=LedgerEntry.amount_micros)
            ).label("held"),
        )
        .group_by(LedgerEntry.user_id)
        .subquery()
    )
    open_holds = (
        select(Hold.user_id.label("user_id"), func.sum(Hold.amount_micros).label("held"))
        .where(Hold.state == HoldState.OPEN)
        .group_by(Hold.user_id)
        .subquery()
    )
    rows = session.execute(
        select(
            User.name,
            Balance.balance_micros,
            Balance.held_micros,
            func.coalesce(sums.c.balance, 0),
            func.coalesce(sums.c.held, 0),
            func.coalesce(open_holds.c.held, 0),
        )
        .select_from(User)
        .join(Balance, Balance.user_id == User.id, isouter=True)
        .join(sums, sums.c.user_id == User.id, isouter=True)
        .join(open_holds, open_holds.c.user_id == User.id, isouter=True)
        .order_by(User.name)
    ).all()
    drifts = []
    for name, bal, held, *totals in rows:
        want_bal, want_held, open_held = (int(total) for total in totals)
        # A missing balance row (None) is drift too: every user gets one at creation.
        if (bal, held, held) != (want_bal, want_held, open_held):
            drifts.append(DriftView(name, bal, want_bal, held, want_held, open_held))
    return ReconcileView(accounts_checked=len(rows), drifts=drifts)
