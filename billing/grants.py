"""Budget periods, grants, rollover and manual adjustments: what a period's money is.

A budget is a spending allowance per period, not a savings account. The rules:

* **A period's spending power is its grant.** At each period start (calendar-aligned in the
  budget's time zone) the user's unused available funds expire through an `adjustment` entry
  and the period's amount is granted. Charges minus refunds counted in a period never exceed
  what was granted for it.
* **Every entry and hold belongs to a period** (`period_start`), computed from the clock by
  the operation itself: each hold, settlement, release, refund, grant and adjustment first
  opens the current period if its boundary has passed (`open_period`). The rollover job only
  does the same for users who do nothing, so the answer never depends on when the job ran.
  After an outage of several periods, only the current one is granted; the periods nobody
  could spend in are granted nothing.
* **A hold belongs to the period it was placed in.** Its charge counts in that period even
  when the batch settles after the boundary, and whatever of it is released (the unused part
  of a settled hold, a dropped or expired request) expires with that period instead of
  returning to the new one. When one batch settles a user's holds from two periods, the
  charge is counted against the older period's holds first (`billing.period_charges`).
* **A refund is credited to the period of the charge it refunds.** A refund of an ended
  period's charge expires with that period, so `spent_this_period` is never negative and no
  period gets back more than it spent.
* **A budget change takes effect at the next boundary of the schedule in force** (amount,
  period and time zone alike); until then it waits in the budget's `pending_*` columns. The
  first period of a new schedule runs from that boundary to the new schedule's next one and is
  granted in full. A lifetime budget (`none`) has no boundary: a new amount is granted (or, when
  lower, taken back from the available funds) at once, and a change to a daily, weekly or
  monthly budget starts at the next boundary of the new schedule, where the remaining lifetime
  funds expire like any period's.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from inference_auctions.billing.errors import InsufficientFunds, InvalidAmount, InvalidInput
from inference_auctions.billing.models import KEY_LENGTH, Budget, EntryKind, User
from inference_auctions.billing.money import MAX_MICROS, check_micros
from inference_auctions.billing.periods import (
    Period,
    next_period_start,
    parse_timezone,
    period_start,
    require_aware,
)
from inference_auctions.billing.postings import (
    Account,
    BudgetRow,
    check_reason,
    entry_view,
    find_entry,
    lock_account,
    post,
    replay,
    time_key,
)
from inference_auctions.billing.views import EntryView


def grant_key(user_id: int, start: datetime) -> str:
    """Idempotency key of the grant of the period starting at `start`."""
    return f"grant:{user_id}:{time_key(start)}"


def budget_row(session: Session, user_id: int) -> Budget:
    """The budget row of a user (every user has one)."""
    budget = session.get(Budget, user_id)
    assert budget is not None, f"user {user_id} has no budget row"
    return budget


def _pending_applies(budget: Budget | BudgetRow, now: datetime) -> bool:
    return budget.pending_from is not None and now >= budget.pending_from


def schedule_at(budget: Budget | BudgetRow, now: datetime) -> tuple[int, Period, str]:
    """The (amount, period, time zone) in force at `now`, a pending change included."""
    if _pending_applies(budget, now):
        assert budget.pending_amount_micros is not None and budget.pending_period is not None
        assert budget.pending_timezone is not None
        return budget.pending_amount_micros, budget.pending_period, budget.pending_timezone
    return budget.amount_micros, budget.period, budget.timezone


def period_at(budget: Budget | BudgetRow, now: datetime) -> datetime:
    """Start of the budget period containing `now` (the current one if `now` is before it)."""
    if _pending_applies(budget, now):
        assert budget.pending_from is not None
        floor = budget.pending_from
    else:
        floor = budget.current_period_start
    _, period, timezone = schedule_at(budget, now)
    if period is Period.NONE:
        return floor
    # A schedule's first period starts where it took effect, not at a calendar boundary.
    return max(floor, period_start(now, period, parse_timezone(timezone)))


def period_end(budget: Budget | BudgetRow, now: datetime) -> datetime | None:
    """End of the period containing `now`: its next boundary, or None for a lifetime budget."""
    start = max(period_at(budget, now), budget.current_period_start)
    _, period, timezone = schedule_at(budget, now)
    # A change still waiting ends the period early; one already in force does not.
    change = None if _pending_applies(budget, now) else budget.pending_from
    if period is Period.NONE:
        return change
    end = next_period_start(start, period, parse_timezone(timezone))
    return end if change is None else min(end, change)


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
            key=grant_key(account.user_id, start),
            now=now,
            reason=(
                "lifetime budget"
                if budget.period is Period.NONE
                else f"{budget.period.value} budget for the period from {start.isoformat()}"
            ),
            period_start=start,
        )


def open_period(session: Session, account: Account, now: datetime) -> Budget:
    """Open the period containing `now` if it is not open yet; the caller holds the lock.

    Returns the budget row, whose `current_period_start` is then the period every new entry
    of this transaction belongs to.
    """
    budget = budget_row(session, account.user_id)
    # The budget as it stands now: on PostgreSQL a lock taken after a wait reads the balance
    # row as the other transaction left it, but the budget row joined to it as it was before.
    account.budget = BudgetRow.of(budget)
    start = period_at(budget, now)
    if start <= budget.current_period_start:
        return budget
    ended = budget.current_period_start
    if account.available > 0:
        post(
            session,
            account,
            EntryKind.ADJUSTMENT,
            -account.available,
            key=f"expire:{account.user_id}:{time_key(start)}",
            now=now,
            reason=f"unused budget expires at the period start {start.isoformat()}",
            period_start=ended,
        )
    if _pending_applies(budget, now):
        budget.amount_micros, budget.period, budget.timezone = schedule_at(budget, now)
        clear_pending(budget)
    budget.current_period_start = start
    budget.updated_at = now
    post_period_grant(session, account, budget, start, now=now)
    account.budget = BudgetRow.of(budget)
    return budget


def open_periods(session: Session, accounts: Mapping[str, Account], now: datetime) -> None:
    """Open the current budget period of every account whose boundary has passed, in name
    order. The common case, no boundary since the last operation, is decided from the locked
    rows alone, without reading the budget again."""
    for name in sorted(accounts):
        account = accounts[name]
        if period_at(account.budget, now) > account.budget.current_period_start:
            open_period(session, account, now)


def is_ended(budget: Budget, start: datetime | None) -> bool:
    """Whether the period starting at `start` ended before the current one (None: unknown)."""
    return start is not None and start < budget.current_period_start


def expire_ended(
    session: Session,
    account: Account,
    budget: Budget,
    start: datetime | None,
    amount_micros: int,
    *,
    key: str,
    reason: str,
    now: datetime,
) -> None:
    """Expire `amount_micros` just returned to an ended period, so the current one gains none."""
    if amount_micros > 0 and is_ended(budget, start):
        post(
            session,
            account,
            EntryKind.ADJUSTMENT,
            -amount_micros,
            key=key,
            now=now,
            reason=reason,
            period_start=start,
        )


def clear_pending(budget: Budget) -> None:
    """Forget a waiting budget change."""
    budget.pending_amount_micros = None
    budget.pending_period = None
    budget.pending_timezone = None
    budget.pending_from = None


def change_budget(
    session: Session,
    account: Account,
    *,
    amount_micros: int | None,
    period: Period | None,
    timezone: str | None,
    now: datetime,
) -> Budget:
    """Schedule a budget change for the next boundary (a lifetime amount changes at once)."""
    budget = open_period(session, account, now)
    current = (budget.amount_micros, budget.period, budget.timezone)
    base = (
        current
        if budget.pending_from is None
        else (budget.pending_amount_micros, budget.pending_period, budget.pending_timezone)
    )
    target = (
        base[0] if amount_micros is None else amount_micros,
        base[1] if period is None else period,
        base[2] if timezone is None else timezone,
    )
    new_amount, new_period, new_timezone = target
    assert new_amount is not None and new_period is not None and new_timezone is not None
    budget.updated_at = now
    if budget.period is Period.NONE and new_period is Period.NONE:
        # A lifetime budget has no boundary to wait for.
        clear_pending(budget)
        budget.timezone = new_timezone
        _change_lifetime_amount(session, account, budget, new_amount, now)
        return budget
    if target == current:
        clear_pending(budget)
        return budget
    if budget.period is Period.NONE:
        # No old boundary: the new schedule starts at its own next one.
        starts = next_period_start(now, new_period, parse_timezone(new_timezone))
    else:
        starts = next_period_start(now, budget.period, parse_timezone(budget.timezone))
    budget.pending_amount_micros = new_amount
    budget.pending_period = new_period
    budget.pending_timezone = new_timezone
    budget.pending_from = starts
    return budget


def _change_lifetime_amount(
    session: Session, account: Account, budget: Budget, amount_micros: int, now: datetime
) -> None:
    difference = amount_micros - budget.amount_micros
    budget.amount_micros = amount_micros
    start = budget.current_period_start
    # set_budget is idempotent by its target, not by a key: a repeated call moves nothing.
    key = f"lifetime:{account.user_id}:{uuid.uuid4().hex}"
    if difference > 0:
        post(
            session,
            account,
            EntryKind.GRANT,
            difference,
            key=key,
            now=now,
            reason=f"lifetime budget raised to {amount_micros} micro-credits",
            period_start=start,
        )
    elif difference < 0 and account.available > 0:
        post(
            session,
            account,
            EntryKind.ADJUSTMENT,
            -min(-difference, account.available),
            key=key,
            now=now,
            reason=f"lifetime budget lowered to {amount_micros} micro-credits",
            period_start=start,
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
    """Grant more to the current period, the one containing `start`; once per user and period."""
    moment = require_aware(start, "period_start")
    check_micros(amount_micros, "amount_micros", positive=True)
    if reason is not None:
        check_reason(reason)
    account = lock_account(session, name)
    budget = open_period(session, account, now)
    current = budget.current_period_start
    end = period_end(budget, now)
    if moment < current:
        raise InvalidInput(
            "period_start",
            f"{moment.isoformat()} lies in a period that has ended; only the current period"
            f" (from {current.isoformat()}) can be granted more",
        )
    if end is not None and moment >= end:
        raise InvalidInput(
            "period_start",
            f"{moment.isoformat()} lies in a period that has not started; only the current"
            f" period (from {current.isoformat()} to {end.isoformat()}) can be granted more",
        )
    key = f"extra-grant:{account.user_id}:{time_key(current)}"
    existing = replay(session, key, account, EntryKind.GRANT, amount_micros)
    if existing is not None:
        return entry_view(existing, name)
    post(
        session,
        account,
        EntryKind.GRANT,
        amount_micros,
        key=key,
        now=now,
        reason=reason or f"extra grant for the period from {current.isoformat()}",
        period_start=current,
    )
    return _posted(session, key, name)


def due_for_rollover(session: Session, now: datetime) -> list[str]:
    """Names of enabled users whose current period is not open yet (no lock)."""
    rows = session.execute(
        select(User.name, Budget)
        .join(Budget, Budget.user_id == User.id)
        .where(User.disabled.is_(False))
        .order_by(User.name)
    ).all()
    return [name for name, budget in rows if period_at(budget, now) > budget.current_period_start]


def rollover_user(session: Session, name: str, now: datetime) -> bool:
    """Open the current period for one user if it is due; False when nothing was due."""
    account = lock_account(session, name)
    # Re-read under the lock: another replica may have opened the period meanwhile.
    if account.disabled:
        return False
    before = budget_row(session, account.user_id).current_period_start
    return open_period(session, account, now).current_period_start > before


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
    existing = replay(session, full_key, account, EntryKind.ADJUSTMENT, amount_micros)
    if existing is not None:
        return entry_view(existing, name)
    budget = open_period(session, account, now)
    if amount_micros < 0 and account.available < -amount_micros:
        raise InsufficientFunds(name, account.available, -amount_micros)
    post(
        session,
        account,
        EntryKind.ADJUSTMENT,
        amount_micros,
        key=full_key,
        now=now,
        reason=reason,
        period_start=budget.current_period_start,
    )
    return _posted(session, full_key, name)


def _posted(session: Session, key: str, name: str) -> EntryView:
    """The view of the entry just posted under `key` (read back: the database numbers it)."""
    entry = find_entry(session, key)
    assert entry is not None
    return entry_view(entry, name)
