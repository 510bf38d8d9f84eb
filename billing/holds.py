"""Holds: funds reserved for a request between admission and settlement.

A hold moves money from available to held (a `hold` entry); settling its batch or releasing it
moves it back (a `release` entry). Both are keyed by the request id, so each happens once.
A hold belongs to the budget period it was placed in: released after that period ended, its
money expires with it (see `billing.grants`).
"""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from inference_auctions.billing.errors import (
    BatchCapExceeded,
    IdempotencyConflict,
    InsufficientFunds,
    UnknownRequest,
    UserDisabled,
)
from inference_auctions.billing.grants import expire_ended, open_period
from inference_auctions.billing.models import (
    REASON_LENGTH,
    Budget,
    EntryKind,
    Hold,
    HoldState,
    LedgerEntry,
    User,
)
from inference_auctions.billing.money import check_micros
from inference_auctions.billing.postings import (
    Account,
    check_id,
    check_reason,
    entry_row,
    lock_account,
    post,
)
from inference_auctions.billing.records import HoldView


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


def place_hold(
    session: Session,
    name: str,
    rid: str,
    amount_micros: int,
    now: datetime,
    fingerprint: str | None = None,
) -> HoldView:
    """Reserve `amount_micros` of the user's available funds for request `rid`.

    A replay with the same amount and payload `fingerprint` returns the hold as it is, except
    that a released one is opened again (nothing was charged for it, so the retry is a fresh
    admission). Another amount, user or fingerprint under the same `rid` is a conflict.
    """
    check_id(rid, "rid")
    check_micros(amount_micros, "amount_micros")
    account = lock_account(session, name)
    existing = session.get(Hold, rid, populate_existing=True)
    if existing is not None:
        if (existing.user_id, existing.amount_micros) != (account.user.id, amount_micros):
            raise IdempotencyConflict(
                f"hold:{rid}",
                f"a hold of {existing.amount_micros} micro-credits was placed for this request,"
                f" now {amount_micros} for user {name!r}",
            )
        if fingerprint is not None and existing.fingerprint not in (None, fingerprint):
            raise IdempotencyConflict(f"hold:{rid}", "the request was held with another payload")
        if existing.state is HoldState.RELEASED:
            _reopen(session, account, existing, now)
        return hold_view(existing, name)
    if account.user.disabled:
        raise UserDisabled(name)
    # The boundary may have passed since the last operation: yesterday's leftovers must not
    # be spendable after midnight, whether or not the rollover job ran.
    period = open_period(session, account, now).current_period_start
    _check_cap(session, account, amount_micros)
    if account.available < amount_micros:
        raise InsufficientFunds(name, account.available, amount_micros)
    hold = Hold(
        rid=rid,
        user_id=account.user.id,
        amount_micros=amount_micros,
        state=HoldState.OPEN,
        created_at=now,
        fingerprint=fingerprint,
        attempt=1,
        period_start=period,
    )
    session.add(hold)
    post(
        session,
        account,
        EntryKind.HOLD,
        amount_micros,
        key=f"hold:{rid}",
        now=now,
        request_id=rid,
        period_start=period,
    )
    session.flush()
    return hold_view(hold, name)


def entry_key(kind: str, rid: str, attempt: int) -> str:
    """Idempotency key of a hold's `kind` entry in its `attempt`-th opening."""
    # The first opening keeps the historical keys; later ones count up.
    return f"{kind}:{rid}" if attempt == 1 else f"{kind}:{rid}#{attempt}"


def _entry_key(kind: str, hold: Hold) -> str:
    return entry_key(kind, hold.rid, hold.attempt)


def _reopen(session: Session, account: Account, hold: Hold, now: datetime) -> None:
    if account.user.disabled:
        raise UserDisabled(account.user.name)
    # A re-opened hold is placed anew: in the current period, against what is available now.
    period = open_period(session, account, now).current_period_start
    _check_cap(session, account, hold.amount_micros)
    if account.available < hold.amount_micros:
        raise InsufficientFunds(account.user.name, account.available, hold.amount_micros)
    hold.attempt += 1
    hold.state = HoldState.OPEN
    hold.created_at = now
    hold.closed_at = None
    hold.batch_id = None
    hold.period_start = period
    post(
        session,
        account,
        EntryKind.HOLD,
        hold.amount_micros,
        key=_entry_key("hold", hold),
        now=now,
        request_id=hold.rid,
        period_start=period,
    )
    session.flush()


def _check_cap(session: Session, account: Account, amount_micros: int) -> None:
    # Every batch draws its requests from the open holds, so capping what is open at once caps
    # what any single batch can charge.
    budget = session.get(Budget, account.user.id)
    cap = None if budget is None else budget.batch_cap_micros
    if cap is None:
        return
    open_total = session.scalar(
        select(func.coalesce(func.sum(Hold.amount_micros), 0)).where(
            Hold.user_id == account.user.id, Hold.state == HoldState.OPEN
        )
    )
    held = int(open_total or 0)
    if held + amount_micros > cap:
        raise BatchCapExceeded(account.user.name, cap, held, amount_micros)


def close_hold(
    session: Session,
    account: Account,
    hold: Hold,
    state: HoldState,
    *,
    reason: str,
    now: datetime,
    batch_id: str | None = None,
) -> None:
    """Release an open hold's funds (settled or dropped); the caller holds the account lock."""
    entry = closing_entry(account, hold, state, reason=reason, now=now, batch_id=batch_id)
    session.add(LedgerEntry(**entry))


def closing_entry(
    account: Account,
    hold: Hold,
    state: HoldState,
    *,
    reason: str,
    now: datetime,
    batch_id: str | None = None,
) -> dict[str, Any]:
    """Close an open hold and move the locked balance row; returns the release entry as a row
    to insert. (Settling a batch closes its holds with Core statements instead.)"""
    hold.state = state
    hold.closed_at = now
    hold.batch_id = batch_id
    return entry_row(
        account,
        EntryKind.RELEASE,
        -hold.amount_micros,
        key=_entry_key("release", hold),
        now=now,
        reason=reason,
        batch_id=batch_id,
        request_id=hold.rid,
        period_start=hold.period_start,
    )


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
