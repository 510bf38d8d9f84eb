"""Read-only aggregates of the market and of one account, for the dashboard.

Everything is summed in SQL, per time bucket or per (batch, user), so the answer stays small
however many batches the ledger holds: the caller gets what it will draw, never raw rows.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from sqlalchemy import BigInteger, ColumnElement, and_, case, cast, func, select
from sqlalchemy.orm import InstrumentedAttribute, Session

from inference_auctions.billing.models import (
    AuctionBatch,
    BatchRequest,
    Budget,
    EntryKind,
    Hold,
    HoldState,
    LedgerEntry,
    RequestStatus,
    User,
)
from inference_auctions.billing.periods import Period, parse_timezone, period_start, require_aware
from inference_auctions.billing.postings import get_user
from inference_auctions.billing.queries import balance
from inference_auctions.billing.views import BalanceView, PricedRequestView

# Charges, fees and floors are negative entries, refunds and what is given back positive:
# their negated sum is the net spend.
_SPEND_KINDS = (EntryKind.CHARGE, EntryKind.REFUND, EntryKind.FEE, EntryKind.FLOOR)


@dataclass(frozen=True, slots=True)
class MarketBucket:
    """Batches that closed in [start, start + width): sizes, money and serving."""

    start: datetime
    batches: int
    requests: int
    largest_batch: int
    revenue_micros: int
    welfare_micros: int
    prompt_tokens: int  # of the requests whose cached tokens the engine reported
    cached_tokens: int
    ttft_samples: int
    ttft_mean_ms: float | None
    ttft_max_ms: float | None
    # Requests of these batches by outcome so far (the rest are still at the engine).
    served: int = 0
    failed: int = 0
    abandoned: int = 0
    # The request fees of those batches, before any given back for failed requests.
    fees_micros: int = 0
    # What their requests paid of the posted price floor, before any given back.
    floors_micros: int = 0


@dataclass(frozen=True, slots=True)
class ClearingPoint:
    """One user's place and charge in one batch (a user may hold several positions)."""

    batch_id: str
    closed_at: datetime
    batch_size: int
    user: str
    requests: int
    best_position: int
    best_priority: float
    charge_micros: int


@dataclass(frozen=True, slots=True)
class Spender:
    """A user's net spend (charges less refunds) since the start of its budget period."""

    user: str
    spent_micros: int
    budget_micros: int
    period: Period
    period_start: datetime


@dataclass(frozen=True, slots=True)
class OpenHolds:
    """Holds placed and neither settled nor released yet."""

    count: int
    amount_micros: int
    oldest: datetime | None


@dataclass(frozen=True, slots=True)
class RecentRequest:
    """One of a user's settled requests, with the user's charge in its batch."""

    rid: str
    batch_id: str
    closed_at: datetime
    batch_size: int
    position: int
    priority: float
    bid_micros: int
    batch_charge_micros: int
    batch_refund_micros: int
    status: RequestStatus
    prompt_tokens: int
    cached_tokens: int | None
    ttft_ms: float | None
    # The request fee it paid: its batch's, none once failed (given back in the same
    # transaction that recorded the failure).
    fee_micros: int = 0


@dataclass(frozen=True, slots=True)
class SpendPoint:
    """Net spend of the period up to and including `at`."""

    at: datetime
    spent_micros: int


@dataclass(frozen=True, slots=True)
class MarketActivity:
    """The market over a recent window, as of one snapshot of the ledger."""

    since: datetime
    until: datetime
    bucket_seconds: int
    buckets: list[MarketBucket]
    clearing: list[ClearingPoint]
    spenders: list[Spender]
    holds: OpenHolds


@dataclass(frozen=True, slots=True)
class AccountActivity:
    """A user's budget period, spend over it, request counts and recent requests."""

    balance: BalanceView
    budget_micros: int
    period: Period
    period_start: datetime
    period_end: datetime | None  # None for a lifetime budget
    spend: list[SpendPoint]
    requests_total: int
    requests_served: int
    requests_failed: int
    requests_abandoned: int
    recent: list[RecentRequest]
    clearing: list[ClearingPoint]
    # When the user's first charge of the period was written (None: nothing spent in it): a
    # rate of spend is taken over the user's own activity, not over the whole period.
    first_spend_at: datetime | None = None
    # How many batches charged the user in the period: fewer than a few make no rate.
    charges_this_period: int = 0
    # Every request of each recent batch in which the user had several requests, so that the
    # user's charge there can be split per request (SPEC section 1, "One request's share").
    shared_batches: dict[str, list[PricedRequestView]] = field(default_factory=dict)


def _epoch_seconds(session: Session, column: InstrumentedAttribute[datetime]) -> ColumnElement[int]:
    # SQLite stores naive UTC text; PostgreSQL a timestamptz. Both become whole epoch seconds.
    if session.get_bind().dialect.name == "sqlite":
        return cast(func.strftime("%s", column), BigInteger)
    return cast(func.floor(func.extract("epoch", column)), BigInteger)


def _bucket(
    session: Session, column: InstrumentedAttribute[datetime], since: datetime, width: int
) -> ColumnElement[int]:
    # Integer division of non-negative integers truncates, so this is a floor on both backends.
    offset = _epoch_seconds(session, column) - int(since.timestamp())
    return offset // width


def market_buckets(
    session: Session, since: datetime, until: datetime, width: timedelta
) -> list[MarketBucket]:
    """Every `width`-long bucket from `since` to `until`, oldest first (empty ones included)."""
    since, until = require_aware(since, "since"), require_aware(until, "until")
    seconds = max(1, int(width.total_seconds()))
    batch_bucket = _bucket(session, AuctionBatch.closed_at, since, seconds).label("bucket")
    in_window = (AuctionBatch.closed_at >= since, AuctionBatch.closed_at < until)
    batch_rows = session.execute(
        select(
            batch_bucket,
            func.count(),
            func.coalesce(func.sum(AuctionBatch.n), 0),
            func.coalesce(func.max(AuctionBatch.n), 0),
            func.coalesce(func.sum(AuctionBatch.revenue_micros), 0),
            func.coalesce(func.sum(AuctionBatch.welfare_micros), 0),
            func.coalesce(func.sum(AuctionBatch.n * AuctionBatch.request_fee_micros), 0),
        )
        .where(*in_window)
        .group_by(batch_bucket)
    ).all()
    reported = BatchRequest.cached_tokens.is_not(None)
    serving_rows = session.execute(
        select(
            batch_bucket,
            func.coalesce(
                func.sum(BatchRequest.prompt_tokens).filter(reported),
                0,
            ),
            func.coalesce(func.sum(BatchRequest.cached_tokens), 0),
            func.count(BatchRequest.ttft_ms),
            func.avg(BatchRequest.ttft_ms),
            func.max(BatchRequest.ttft_ms),
            *(
                func.count().filter(BatchRequest.status == status)
                for status in (RequestStatus.SERVED, RequestStatus.FAILED, RequestStatus.ABANDONED)
            ),
            func.coalesce(func.sum(BatchRequest.floor_micros), 0),
        )
        .join(AuctionBatch, AuctionBatch.id == BatchRequest.batch_id)
        .where(*in_window)
        .group_by(batch_bucket)
    ).all()
    batches = {int(row[0]): row for row in batch_rows}
    serving = {int(row[0]): row for row in serving_rows}
    count = max(1, -(-int((until - since).total_seconds()) // seconds))
    buckets = []
    for index in range(count):
        b = batches.get(index)
        s = serving.get(index)
        buckets.append(
            MarketBucket(
                start=since + timedelta(seconds=index * seconds),
                batches=int(b[1]) if b else 0,
                requests=int(b[2]) if b else 0,
                largest_batch=int(b[3]) if b else 0,
                revenue_micros=int(b[4]) if b else 0,
                welfare_micros=int(b[5]) if b else 0,
                prompt_tokens=int(s[1]) if s else 0,
                cached_tokens=int(s[2]) if s else 0,
                ttft_samples=int(s[3]) if s else 0,
                ttft_mean_ms=float(s[4]) if s and s[4] is not None else None,
                ttft_max_ms=float(s[5]) if s and s[5] is not None else None,
                served=int(s[6]) if s else 0,
                failed=int(s[7]) if s else 0,
                abandoned=int(s[8]) if s else 0,
                fees_micros=int(b[6]) if b else 0,
                floors_micros=int(s[9]) if s else 0,
            )
        )
    return buckets


def clearing_points(
    session: Session, since: datetime, limit: int, user: str | None = None
) -> list[ClearingPoint]:
    """Each (batch, user) of batches closed since `since`, newest first, at most `limit`."""
    since = require_aware(since, "since")
    # The newest `limit` batches first (each gives at least one point), so the grouping below
    # touches only their requests and charges, however many batches the window holds.
    recent_batches = (
        select(AuctionBatch.id, AuctionBatch.closed_at, AuctionBatch.n)
        .where(AuctionBatch.closed_at >= since)
        .order_by(AuctionBatch.closed_at.desc(), AuctionBatch.id)
        .limit(limit)
    )
    requests = select(BatchRequest)
    charges = select(LedgerEntry).where(LedgerEntry.kind == EntryKind.CHARGE)
    if user is not None:
        user_id = get_user(session, user).id
        mine = select(BatchRequest.batch_id).where(BatchRequest.user_id == user_id)
        recent_batches = recent_batches.where(AuctionBatch.id.in_(mine))
        requests = requests.where(BatchRequest.user_id == user_id)
        charges = charges.where(LedgerEntry.user_id == user_id)
    b, r, e = recent_batches.subquery(), requests.subquery(), charges.subquery()
    points = (
        select(
            b.c.id.label("batch_id"),
            b.c.closed_at.label("closed_at"),
            b.c.n.label("n"),
            r.c.user_id.label("user_id"),
            func.count().label("requests"),
            func.min(r.c.position).label("position"),
            func.max(r.c.priority).label("priority"),
        )
        .join(r, r.c.batch_id == b.c.id)
        .group_by(b.c.id, b.c.closed_at, b.c.n, r.c.user_id)
        .subquery()
    )
    paid = (
        select(
            e.c.batch_id.label("batch_id"),
            e.c.user_id.label("user_id"),
            func.sum(e.c.amount_micros).label("amount"),
        )
        .join(b, b.c.id == e.c.batch_id)
        .group_by(e.c.batch_id, e.c.user_id)
        .subquery()
    )
    rows = session.execute(
        select(
            points.c.batch_id,
            points.c.closed_at,
            points.c.n,
            User.name,
            points.c.requests,
            points.c.position,
            points.c.priority,
            func.coalesce(paid.c.amount, 0),
        )
        .join(User, User.id == points.c.user_id)
        .outerjoin(
            paid, and_(paid.c.batch_id == points.c.batch_id, paid.c.user_id == points.c.user_id)
        )
        .order_by(points.c.closed_at.desc(), points.c.batch_id, User.name)
        .limit(limit)
    ).all()
    return [
        ClearingPoint(
            batch_id=batch_id,
            # A subquery column may lose the UTC type on SQLite: give it back its zone.
            closed_at=closed_at if closed_at.tzinfo else closed_at.replace(tzinfo=UTC),
            batch_size=int(n),
            user=name,
            requests=int(requests),
            best_position=int(position),
            best_priority=float(priority),
            charge_micros=-int(amount),
        )
        for batch_id, closed_at, n, name, requests, position, priority, amount in rows
    ]


def _batch_money(
    session: Session, batch_ids: Iterable[str], kinds: Sequence[EntryKind]
) -> dict[tuple[str, int], int]:
    """Signed sums of the entries of `kinds` per (batch, user id)."""
    ids = sorted(batch_ids)
    sums: dict[tuple[str, int], int] = defaultdict(int)
    for start in range(0, len(ids), 500):  # bounded IN lists on every backend
        # Not narrowed to one user in SQL: SQLite would then walk all of the user's entries
        # instead of the few of these batches (the batch index).
        rows = session.execute(
            select(LedgerEntry.batch_id, LedgerEntry.user_id, func.sum(LedgerEntry.amount_micros))
            .where(LedgerEntry.batch_id.in_(ids[start : start + 500]))
            .where(LedgerEntry.kind.in_(kinds))
            .group_by(LedgerEntry.batch_id, LedgerEntry.user_id)
        ).all()
        for batch_id, user_id, amount in rows:
            sums[(str(batch_id), int(user_id))] += int(amount)
    return sums


def current_period(budget: Budget, now: datetime) -> tuple[datetime, datetime | None]:
    """Start and end of the budget period containing `now` (no end for a lifetime budget)."""
    if budget.period is Period.NONE:
        return budget.current_period_start, None
    tz = parse_timezone(budget.timezone)
    start = period_start(now, budget.period, tz)
    # A step that surely lands inside the next period, whatever DST does to day lengths.
    step = {
        Period.DAY: timedelta(hours=26),
        Period.WEEK: timedelta(days=7, hours=2),
        Period.MONTH: timedelta(days=32),
    }[budget.period]
    return start, period_start(start + step, budget.period, tz)


def top_spenders(session: Session, now: datetime, limit: int) -> list[Spender]:
    """The users who spent most in their current budget period, most first."""
    now = require_aware(now, "now")
    rows = session.execute(select(User.id, User.name, Budget).join(Budget)).all()
    # Users whose periods start together are summed by one query; there are few such groups.
    groups: dict[datetime, list[int]] = defaultdict(list)
    users: dict[int, tuple[str, Budget, datetime]] = {}
    for user_id, name, budget in rows:
        start, _ = current_period(budget, now)
        groups[start].append(user_id)
        users[user_id] = (name, budget, start)
    spent: dict[int, int] = {}
    for start, ids in groups.items():
        for chunk in range(0, len(ids), 500):
            sums = session.execute(
                select(LedgerEntry.user_id, func.sum(LedgerEntry.amount_micros))
                .where(LedgerEntry.user_id.in_(ids[chunk : chunk + 500]))
                .where(LedgerEntry.kind.in_(_SPEND_KINDS), LedgerEntry.created_at >= start)
                .group_by(LedgerEntry.user_id)
            ).all()
            spent.update({int(user_id): -int(total) for user_id, total in sums})
    ranked = sorted(
        (uid for uid in spent if spent[uid] > 0), key=lambda uid: (-spent[uid], users[uid][0])
    )
    return [
        Spender(
            user=users[uid][0],
            spent_micros=spent[uid],
            budget_micros=users[uid][1].amount_micros,
            period=users[uid][1].period,
            period_start=users[uid][2],
        )
        for uid in ranked[:limit]
    ]


def open_holds(session: Session) -> OpenHolds:
    """How many holds are open, how much they hold, and when the oldest was placed."""
    count, amount, oldest = session.execute(
        select(
            func.count(), func.coalesce(func.sum(Hold.amount_micros), 0), func.min(Hold.created_at)
        ).where(Hold.state == HoldState.OPEN)
    ).one()
    return OpenHolds(count=int(count), amount_micros=int(amount), oldest=oldest)


def market_activity(
    session: Session,
    now: datetime,
    window: timedelta,
    width: timedelta,
    *,
    points: int,
    spenders: int,
) -> MarketActivity:
    """Buckets of the last `window`, its latest `points` clearing points, the top `spenders`
    of their current periods (none when 0), and the open holds."""
    now = require_aware(now, "now")
    seconds = max(1, int(width.total_seconds()))
    # Buckets aligned to whole multiples of their width, so a chart does not shimmer as the
    # window slides by less than a bucket between two polls.
    end = datetime.fromtimestamp((int(now.timestamp()) // seconds + 1) * seconds, now.tzinfo)
    since = end - window
    return MarketActivity(
        since=since,
        until=end,
        bucket_seconds=seconds,
        buckets=market_buckets(session, since, end, timedelta(seconds=seconds)),
        clearing=clearing_points(session, since, points),
        spenders=top_spenders(session, now, spenders) if spenders else [],
        holds=open_holds(session),
    )


def account_activity(
    session: Session, name: str, now: datetime, *, points: int, recent: int, clearing: int
) -> AccountActivity:
    """The user's spend over its current period (at most `points` steps), its request counts,
    its `recent` latest requests, and its place and charge in its `clearing` latest batches."""
    now = require_aware(now, "now")
    user = get_user(session, name)
    budget = session.get(Budget, user.id)
    assert budget is not None
    start, end = current_period(budget, now)
    counts = dict(
        session.execute(
            select(BatchRequest.status, func.count())
            .where(BatchRequest.user_id == user.id)
            .group_by(BatchRequest.status)
        ).all()
    )
    # The user's latest batches in one pass over its requests; everything else the view
    # shows (its recent requests, its charges) is read for those batches only.
    batches = _latest_batches(session, user.id, max(clearing, recent))
    latest = _recent_requests(session, user.id, batches[:recent], recent)
    since = start - timedelta(days=31)
    first_spend_at, charges = session.execute(
        select(
            func.min(LedgerEntry.created_at),
            func.count(case((LedgerEntry.kind == EntryKind.CHARGE, 1))),
        ).where(
            LedgerEntry.user_id == user.id,
            LedgerEntry.kind.in_(_SPEND_KINDS),
            LedgerEntry.created_at >= start,
        )
    ).one()
    return AccountActivity(
        balance=balance(session, name, now),
        budget_micros=budget.amount_micros,
        period=budget.period,
        period_start=start,
        period_end=end,
        spend=_spend_series(session, user.id, start, now, points),
        requests_total=sum(int(c) for c in counts.values()),
        requests_served=int(counts.get(RequestStatus.SERVED, 0)),
        requests_failed=int(counts.get(RequestStatus.FAILED, 0)),
        requests_abandoned=int(counts.get(RequestStatus.ABANDONED, 0)),
        recent=latest,
        clearing=_user_clearing(session, user.id, name, [b for b in batches if b[1] >= since]),
        first_spend_at=first_spend_at,
        charges_this_period=int(charges),
        shared_batches=_batches_of_several(session, latest),
    )


def _batches_of_several(
    session: Session, latest: list[RecentRequest]
) -> dict[str, list[PricedRequestView]]:
    per_batch: dict[str, int] = defaultdict(int)
    for recent in latest:
        per_batch[recent.batch_id] += 1
    several = [batch_id for batch_id, n in per_batch.items() if n > 1]
    if not several:
        return {}
    # Each batch is priced again under the slots it was cleared with, as its refunds are.
    rows = session.execute(
        select(BatchRequest, User.name, AuctionBatch.priority_slots, AuctionBatch.pricing_rule)
        .join(User, User.id == BatchRequest.user_id)
        .join(AuctionBatch, AuctionBatch.id == BatchRequest.batch_id)
        .where(BatchRequest.batch_id.in_(several))
        .order_by(BatchRequest.position)
    ).all()
    batches: dict[str, list[PricedRequestView]] = defaultdict(list)
    for request, owner, slots, rule in rows:
        batches[request.batch_id].append(PricedRequestView.of(request, owner, slots, rule))
    return dict(batches)


def _spend_series(
    session: Session, user_id: int, start: datetime, now: datetime, points: int
) -> list[SpendPoint]:
    seconds = max(1, -(-int((now - start).total_seconds()) // max(1, points)))
    bucket = _bucket(session, LedgerEntry.created_at, start, seconds).label("bucket")
    rows = session.execute(
        select(bucket, func.sum(LedgerEntry.amount_micros))
        .where(LedgerEntry.user_id == user_id, LedgerEntry.kind.in_(_SPEND_KINDS))
        .where(LedgerEntry.created_at >= start)
        .group_by(bucket)
        .order_by(bucket)
    ).all()
    series = [SpendPoint(at=start, spent_micros=0)]
    total = 0
    for index, amount in rows:
        total -= int(amount)
        at = min(now, start + timedelta(seconds=(int(index) + 1) * seconds))
        series.append(SpendPoint(at=at, spent_micros=total))
    if series[-1].at < now:
        series.append(SpendPoint(at=now, spent_micros=total))
    return series


# One of a user's batches: (id, closed at, size, the user's requests, best position, best
# priority), as `_latest_batches` reads them.
_UserBatch = tuple[str, datetime, int, int, int, float]


def _latest_batches(session: Session, user_id: int, limit: int) -> list[_UserBatch]:
    """The user's `limit` latest batches, newest first."""
    rows = session.execute(
        select(
            BatchRequest.batch_id,
            AuctionBatch.closed_at,
            AuctionBatch.n,
            func.count(),
            func.min(BatchRequest.position),
            func.max(BatchRequest.priority),
        )
        .join(AuctionBatch, AuctionBatch.id == BatchRequest.batch_id)
        .where(BatchRequest.user_id == user_id)
        .group_by(BatchRequest.batch_id, AuctionBatch.closed_at, AuctionBatch.n)
        .order_by(AuctionBatch.closed_at.desc(), BatchRequest.batch_id)
        .limit(limit)
    ).all()
    return [
        (
            str(batch_id),
            closed_at if closed_at.tzinfo else closed_at.replace(tzinfo=UTC),
            int(n),
            int(requests),
            int(position),
            float(priority),
        )
        for batch_id, closed_at, n, requests, position, priority in rows
    ]


def _user_clearing(
    session: Session, user_id: int, name: str, batches: list[_UserBatch]
) -> list[ClearingPoint]:
    """The user's place and charge in each of `batches`."""
    charges = _batch_money(session, (b[0] for b in batches), (EntryKind.CHARGE,))
    return [
        ClearingPoint(
            batch_id=batch_id,
            closed_at=closed_at,
            batch_size=n,
            user=name,
            requests=requests,
            best_position=position,
            best_priority=priority,
            charge_micros=-charges.get((batch_id, user_id), 0),
        )
        for batch_id, closed_at, n, requests, position, priority in batches
    ]


def _recent_requests(
    session: Session, user_id: int, batches: list[_UserBatch], limit: int
) -> list[RecentRequest]:
    """The user's `limit` latest requests, which are all in its `limit` latest `batches`."""
    if not batches:
        return []
    rows = session.execute(
        select(
            BatchRequest, AuctionBatch.closed_at, AuctionBatch.n, AuctionBatch.request_fee_micros
        )
        .join(AuctionBatch, AuctionBatch.id == BatchRequest.batch_id)
        .where(BatchRequest.user_id == user_id)
        .where(BatchRequest.batch_id.in_([b[0] for b in batches]))
        .order_by(AuctionBatch.closed_at.desc(), BatchRequest.position)
        .limit(limit)
    ).all()
    batch_ids = {request.batch_id for request, _, _, _ in rows}
    charges = _batch_money(session, batch_ids, (EntryKind.CHARGE,))
    refunds = _batch_money(session, batch_ids, (EntryKind.REFUND,))
    return [
        RecentRequest(
            rid=request.rid,
            batch_id=request.batch_id,
            closed_at=closed_at,
            batch_size=n,
            position=request.position,
            priority=request.priority,
            bid_micros=request.bid_micros,
            batch_charge_micros=-charges.get((request.batch_id, user_id), 0),
            batch_refund_micros=refunds.get((request.batch_id, user_id), 0),
            status=request.status,
            prompt_tokens=request.prompt_tokens,
            cached_tokens=request.cached_tokens,
            ttft_ms=request.ttft_ms,
            fee_micros=0 if request.status is RequestStatus.FAILED else int(fee),
        )
        for request, closed_at, n, fee in rows
    ]
