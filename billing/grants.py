"""Grants, period rollover and manual adjustments.

Budget semantics: a budget is a spending allowance per period, not a savings account. At each
period start (calendar-aligned in the budget's time zone) the user's unused available funds
expire through an `adjustment` entry and the period's amount is granted, so a user starts
every period with exactly the budget available. Funds held for requests in flight at the
boundary are not forfeited; what is released of them afterwards returns to the new period's
available funds. A lifetime budget (`none`) is granted once, at creation. A changed budget takes
effect at the next period boundary.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from billing.errors import InsufficientFunds, InvalidAmount, InvalidInput
from billing.models import KEY_LENGTH, Budget, EntryKind, User
from billing.money import MAX_MICROS, check_micros
from billing.periods import Period, parse_timezone, period_start, require_aware
from billing.postings import (
    Account,
    check_reason,
    entry_view,
    find_entry,
    lock_account,
    post,
    replay,
    time_key,
)
from billing.records import EntryView


def grant_key(user_id: int, start: datetime) -> str:
    """Idempotency key of the grant of the period starting at `start`."""
    return f"grant:{user_id}:{time_key(start)}"


def post_period_grant(
    session: Session, account: Account, budget: Budget, start: datetime, *, now: datetime
) -> None:
    """Grant the budget's amount for the period starting at `start` (nothing when it is 0)."""
    if budget.amount_micros > 0:
        post(
            session,
            account,
            EntryKind.GRANT,
            budget.amount_micros,
            key=grant_key(account.user.id, start),
            now=now,
            reason=(
                "lifetime budget"
                if budget.period is Period.NONE
                else f"{budget.period.value} budget for the period from {start.isoformat()}"
            ),
        )


def grant(
    session: Session,
    name: str,
    start: datetime,
    amount_micros: int,
    *,
    reason: str | None,
    now: datetime,
) -> EntryView:
    """Grant `amount_micros` for the period starting at `start`; once per user and period."""
    start = require_aware(start, "period_start")
    check_micros(amount_micros, "amount_micros", positive=True)
    if reason is not None:
        check_reason(reason)
    account = lock_account(session, name)
    key = grant_key(account.user.id, start)
    existing = replay(session, key, account.user, EntryKind.GRANT, amount_micros)
    if existing is not None:
        return entry_view(existing, name)
    entry = post(
        session,
        account,
        EntryKind.GRANT,
        amount_micros,
        key=key,
        now=now,
        reason=reason or f"grant for the period from {start.isoformat()}",
    )
    session.flush()
    return entry_view(entry, name)


def due_for_rollover(session: Session, now: datetime) -> list[str]:
    """Names of enabled users whose budget period started after their last grant (no lock)."""
    rows = session.execute(
        select(User.name, Budget)
        .join(Budget, Budget.user_id == User.id)
        .where(Budget.period != Period.NONE, User.disabled.is_(False))
        .order_by(User.name)
    ).all()
    return [name for name, budget in rows if _current_start(budget, now) is not None]


def _current_start(budget: Budget, now: datetime) -> datetime | None:
    # The start of the period containing `now`, when it is later than the last one granted.
    if budget.period is Period.NONE:
        return None
    start = period_start(now, budget.period, parse_timezone(budget.timezone))
    return start if start > budget.current_period_start else None


def rollover_user(session: Session, name: str, now: datetime) -> bool:
    """Open the current period for one user if it is due; False when nothing was due."""
    account = lock_account(session, name)
    budget = session.get(Budget, account.user.id)
    # Re-read under the lock: another replica may have rolled this user over meanwhile.
    if budget is None or account.user.disabled:
        return False
    start = _current_start(budget, now)
    if start is None:
        return False
    budget.current_period_start = start
    budget.updated_at = now
    if find_entry(session, grant_key(account.user.id, start)) is not None:
        # Granted by hand already; forfeiting now would take from that grant.
        return False
    if account.available > 0:
        post(
            session,
            account,
            EntryKind.ADJUSTMENT,
            -account.available,
            key=f"expire:{account.user.id}:{time_key(start)}",
            now=now,
            reason=f"unused budget expires at the period start {start.isoformat()}",
        )
    post_period_grant(session, account, budget, start, now=now)
    return True


def adjust(
    session: Session,
    name: str,
    amount_micros: int,
    *,
    reason: str,
    key: str,
    now: datetime,
) -> EntryView:
    """Correct a balance by a signed amount; idempotent under the caller's `key`."""
    if isinstance(amount_micros, bool) or not isinstance(amount_micros, int):
        raise InvalidAmount("amount_micros", "must be an integer number of micro-credits")
    if amount_micros == 0 or abs(amount_micros) > MAX_MICROS:
        raise InvalidAmount(
            "amount_micros",
            f"must be non-zero and at most {MAX_MICROS} in size, got {amount_micros}",
        )
    check_reason(reason)
    if not isinstance(key, str) or not key or len(key) > KEY_LENGTH - 7:
        raise InvalidInput(
            "key", f"must be a non-empty string of at most {KEY_LENGTH - 7} characters"
        )
    account = lock_account(session, name)
    full_key = f"adjust:{key}"
    existing = replay(session, full_key, account.user, EntryKind.ADJUSTMENT, amount_micros)
    if existing is not None:
        return entry_view(existing, name)
    if amount_micros < 0 and account.available < -amount_micros:
        raise InsufficientFunds(name, account.available, -amount_micros)
    entry = post(
        session, account, EntryKind.ADJUSTMENT, amount_micros, key=full_key, now=now, reason=reason
    )
    session.flush()
    return entry_view(entry, name)
