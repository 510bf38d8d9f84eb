"""Read-only questions about an account: balance, entries (paginated), summaries."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from datetime import datetime

from sqlalchemy import Select, and_, func, or_, select
from sqlalchemy.orm import Session

from inference_auctions.billing.errors import InvalidInput
from inference_auctions.billing.grants import period_at, period_end, schedule_at
from inference_auctions.billing.models import Balance, Budget, EntryKind, LedgerEntry, User
from inference_auctions.billing.periods import (
    Period,
    parse_period,
    parse_timezone,
    period_start,
    require_aware,
)
from inference_auctions.billing.postings import check_name, entry_view, get_user
from inference_auctions.billing.views import BalanceView, EntryPage, EntryView, SummaryView

MAX_PAGE = 1000


def balance(session: Session, name: str, now: datetime) -> BalanceView:
    """Balance, held and available funds, and the net spend of the current period.

    When the period's boundary has passed but nothing has opened it yet, the answer is what
    opening it will leave: the new grant available and nothing spent.
    """
    user = get_user(session, name)
    account = session.get(Balance, user.id)
    budget = session.get(Budget, user.id)
    assert account is not None and budget is not None
    start = period_at(budget, now)
    if start > budget.current_period_start:
        amount, period, _ = schedule_at(budget, now)
        return BalanceView(
            user=name,
            balance_micros=account.held_micros + amount,
            held_micros=account.held_micros,
            available_micros=amount,
            spent_this_period_micros=0,
            period=period,
            period_start=start,
            period_end=period_end(budget, now),
        )
    start = budget.current_period_start
    spent = session.scalar(
        select(func.coalesce(func.sum(LedgerEntry.amount_micros), 0)).where(
            LedgerEntry.user_id == user.id,
            LedgerEntry.kind.in_(
                [EntryKind.CHARGE, EntryKind.REFUND, EntryKind.FEE, EntryKind.FLOOR]
            ),
            or_(
                LedgerEntry.period_start == start,
                # Entries from before periods were recorded count by their time.
                and_(LedgerEntry.period_start.is_(None), LedgerEntry.created_at >= start),
            ),
        )
    )
    return BalanceView(
        user=name,
        balance_micros=account.balance_micros,
        held_micros=account.held_micros,
        available_micros=account.balance_micros - account.held_micros,
        # Charges and fees are negative entries; refunds (and fees given back) are credited
        # to their period, so this is never negative (old untagged entries aside, hence the
        # floor).
        spent_this_period_micros=max(0, -int(spent or 0)),
        period=budget.period,
        period_start=start,
        period_end=period_end(budget, now),
    )


def parse_kind(kind: str | EntryKind | None) -> EntryKind | None:
    """The entry kind named `kind`, or None for all kinds."""
    if kind is None:
        return None
    try:
        return EntryKind(kind)
    except ValueError:
        choices = ", ".join(k.value for k in EntryKind)
        raise InvalidInput("kind", f"must be one of {choices}, got {kind!r}") from None


def _filtered(
    name: str | None,
    since: datetime | None,
    until: datetime | None,
    kind: EntryKind | None,
) -> Select[LedgerEntry, str]:
    query = select(LedgerEntry, User.name).join(User, User.id == LedgerEntry.user_id)
    if name is not None:
        query = query.where(User.name == check_name(name))
    if since is not None:
        query = query.where(LedgerEntry.created_at >= require_aware(since, "since"))
    if until is not None:
        query = query.where(LedgerEntry.created_at < require_aware(until, "until"))
    if kind is not None:
        query = query.where(LedgerEntry.kind == kind)
    return query.order_by(LedgerEntry.id)


def entries(
    session: Session,
    name: str,
    *,
    since: datetime | None,
    until: datetime | None,
    kind: str | EntryKind | None,
    limit: int,
    cursor: str | None,
) -> EntryPage:
    """One page of the user's entries in [since, until), oldest first."""
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_PAGE:
        raise InvalidInput("limit", f"must be an integer in [1, {MAX_PAGE}], got {limit!r}")
    after = _parse_cursor(cursor)
    get_user(session, name)
    query = _filtered(name, since, until, parse_kind(kind)).limit(limit + 1)
    if after is not None:
        query = query.where(LedgerEntry.id > after)
    rows = session.execute(query).all()
    page = [entry_view(entry, user) for entry, user in rows[:limit]]
    next_cursor = str(page[-1].id) if len(rows) > limit else None
    return EntryPage(entries=page, next_cursor=next_cursor)


def _parse_cursor(cursor: str | None) -> int | None:
    if cursor is None:
        return None
    # ASCII digits only (str.isdigit also accepts '²'), and short enough for a BIGINT id.
    if (
        not isinstance(cursor, str)
        or not (cursor.isascii() and cursor.isdigit())
        or len(cursor) > 18
    ):
        raise InvalidInput("cursor", f"is not a cursor returned by a previous page: {cursor!r}")
    return int(cursor)


def iter_entries(
    session: Session,
    name: str | None,
    since: datetime | None,
    until: datetime | None,
    kind: str | EntryKind | None = None,
) -> Iterator[EntryView]:
    """Every matching entry, oldest first, streamed (all users when `name` is None)."""
    if name is not None:
        get_user(session, name)
    query = _filtered(name, since, until, parse_kind(kind)).execution_options(yield_per=1000)
    for entry, user in session.execute(query):
        yield entry_view(entry, user)


def summary(
    session: Session,
    name: str,
    by: str,
    since: datetime | None,
    until: datetime | None,
) -> list[SummaryView]:
    """Totals per day, week or month in the user's budget time zone, oldest first."""
    bucket = parse_period(by, "by")
    if bucket is Period.NONE:
        raise InvalidInput("by", "must be day, week or month")
    user = get_user(session, name)
    budget = session.get(Budget, user.id)
    assert budget is not None
    tz = parse_timezone(budget.timezone)
    totals: dict[datetime, dict[EntryKind, int]] = defaultdict(lambda: defaultdict(int))
    counts: dict[datetime, int] = defaultdict(int)
    for entry in iter_entries(session, name, since, until):
        start = period_start(entry.created_at, bucket, tz)
        totals[start][entry.kind] += entry.amount_micros
        counts[start] += 1
    rows = []
    for start in sorted(totals):
        sums = totals[start]
        rows.append(
            SummaryView(
                period_start=start,
                granted_micros=sums[EntryKind.GRANT],
                charged_micros=-sums[EntryKind.CHARGE],
                refunded_micros=sums[EntryKind.REFUND],
                adjusted_micros=sums[EntryKind.ADJUSTMENT],
                net_micros=sum(
                    sums[k]
                    for k in (
                        EntryKind.GRANT,
                        EntryKind.CHARGE,
                        EntryKind.REFUND,
                        EntryKind.ADJUSTMENT,
                        EntryKind.FEE,
                        EntryKind.FLOOR,
                    )
                ),
                entries=counts[start],
                fees_micros=-sums[EntryKind.FEE],
                floors_micros=-sums[EntryKind.FLOOR],
            )
        )
    return rows
