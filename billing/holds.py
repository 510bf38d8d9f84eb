"""Holds: funds reserved for a request between admission and settlement.

A hold moves money from available to held (a `hold` entry: placed by `billing.hold_groups`, the
one path that places holds); settling its batch or releasing it moves it back (a `release`
entry, `release_entry`, the one rule for both). Both are keyed by the request id, so each
happens once. A hold belongs to the budget period it was placed in: released after that
period ended, its money expires with it (see `billing.grants`).
"""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from inference_auctions.billing.errors import UnknownRequest
from inference_auctions.billing.grants import expire_ended, open_period
from inference_auctions.billing.hold_rows import HoldRow
from inference_auctions.billing.models import REASON_LENGTH, EntryKind, Hold, HoldState, User
from inference_auctions.billing.postings import (
    Account,
    check_id,
    check_reason,
    insert_entries,
    lock_account,
    write_balances,
)
from inference_auctions.billing.views import HoldView


def hold_view(hold: Hold, user_name: str) -> HoldView:
    """The public view of a hold."""
    return HoldView(
        rid=hold.rid,
        user=user_name,
        amount_micros=hold.amount_micros,
        state=hold.state,
        created_at=hold.created_at,
        batch_id=hold.batch_id,
    )


def entry_key(kind: str, rid: str, attempt: int) -> str:
    """Idempotency key of a hold's `kind` entry in its `attempt`-th opening."""
    # The first opening keeps the historical keys; later ones count up.
    return f"{kind}:{rid}" if attempt == 1 else f"{kind}:{rid}#{attempt}"


def _entry_key(kind: str, hold: Hold) -> str:
    return entry_key(kind, hold.rid, hold.attempt)


def release_entry(
    account: Account,
    hold: Hold | HoldRow,
    *,
    reason: str,
    now: datetime,
    batch_id: str | None = None,
) -> dict[str, Any]:
    """Move the locked account by the release of an open hold (settled in `batch_id`, or
    dropped) and return the `release` entry as a row to insert."""
    return account.entry(
        EntryKind.RELEASE,
        -hold.amount_micros,
        key=entry_key("release", hold.rid, hold.attempt),
        now=now,
        reason=reason,
        batch_id=batch_id,
        request_id=hold.rid,
        period_start=hold.period_start,
    )


def close_hold(
    session: Session,
    account: Account,
    hold: Hold,
    state: HoldState,
    *,
    reason: str,
    now: datetime,
) -> None:
    """Release an open hold's funds unused; the caller holds the account lock. (Settling a
    batch closes its holds with one statement, `billing.settlement`.)"""
    hold.state = state
    hold.closed_at = now
    hold.batch_id = None
    insert_entries(session, [release_entry(account, hold, reason=reason, now=now)])
    write_balances(session, [account], now)


def drop_hold(
    session: Session, account: Account, hold: Hold, *, reason: str, now: datetime
) -> None:
    """Release an open hold unused; if its period has ended, the money expires with it."""
    budget = open_period(session, account, now)
    close_hold(session, account, hold, HoldState.RELEASED, reason=reason, now=now)
    expire_ended(
        session,
        account,
        budget,
        hold.period_start,
        hold.amount_micros,
        key=_entry_key("expire-hold", hold),
        reason=f"released after its period ended ({reason})"[:REASON_LENGTH],
        now=now,
    )


def find_hold(session: Session, rid: str) -> HoldView | None:
    """The hold placed for `rid`, if any."""
    row = session.execute(
        select(Hold, User.name)
        .join(User, User.id == Hold.user_id)
        .where(Hold.rid == check_id(rid, "rid"))
    ).first()
    return None if row is None else hold_view(row[0], row[1])


def release(session: Session, rid: str, reason: str, now: datetime) -> HoldView:
    """Release the hold of a request dropped before dispatch; a closed hold is left as it is."""
    check_reason(reason)
    found = find_hold(session, rid)
    if found is None:
        raise UnknownRequest(rid)
    account = lock_account(session, found.user)
    hold = session.get(Hold, rid, populate_existing=True)
    assert hold is not None
    if hold.state is HoldState.OPEN:
        drop_hold(session, account, hold, reason=reason, now=now)
        session.flush()
    return hold_view(hold, found.user)


def stale_holds(session: Session, cutoff: datetime) -> dict[str, list[str]]:
    """Open holds created before `cutoff`, grouped by user name (no lock)."""
    rows = session.execute(
        select(User.name, Hold.rid)
        .join(User, User.id == Hold.user_id)
        .where(Hold.state == HoldState.OPEN, Hold.created_at < cutoff)
        .order_by(User.name, Hold.rid)
    ).all()
    grouped: dict[str, list[str]] = defaultdict(list)
    for name, rid in rows:
        grouped[name].append(rid)
    return dict(grouped)


def expire_user_holds(
    session: Session, name: str, rids: list[str], max_age: timedelta, now: datetime
) -> int:
    """Release those of `rids` that are still open; returns how many were released."""
    account = lock_account(session, name)
    holds = session.scalars(
        select(Hold).where(Hold.rid.in_(rids)).execution_options(populate_existing=True)
    ).all()
    released = 0
    for hold in sorted(holds, key=lambda h: h.rid):
        # Re-checked under the lock: a settlement or another replica may have closed it.
        if hold.state is HoldState.OPEN and hold.created_at < now - max_age:
            reason = f"expired: not settled within {max_age.total_seconds():g} s"
            drop_hold(session, account, hold, reason=reason, now=now)
            released += 1
    return released
