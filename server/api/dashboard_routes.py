"""The dashboard's JSON API: sign-in sessions, one's own account, the market (admin only).

Every endpoint takes the API key as the rest of the API does (`Authorization: Bearer`) or the
session cookie that `POST /v1/dashboard/session` sets in exchange for it, so the page holds
the key only for that one request. Answers are aggregated in the database: what a chart draws.
"""

from __future__ import annotations

import asyncio
import socket
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Annotated, Any

import orjson
from fastapi import APIRouter, Depends, Request, Response

from inference_auctions.billing import AccountActivity, ClearingPoint, MarketActivity, UserInfo
from inference_auctions.server.api.deps import AppState, CurrentUser, State, current_user
from inference_auctions.server.api.ledger_routes import balance_json
from inference_auctions.server.dashboard.health import ReconcileStatus
from inference_auctions.server.dashboard.sessions import COOKIE_NAME
from inference_auctions.server.errors import Forbidden, Unauthenticated
from inference_auctions.server.serving.clearing import settled_repricer

router = APIRouter(prefix="/v1/dashboard", tags=["dashboard"])

MARKET_WINDOW = timedelta(minutes=15)
MARKET_BUCKET = timedelta(seconds=15)
# Enough points for a scatter to show its shape; more would only slow the page down.
CLEARING_POINTS = 1500
TOP_SPENDERS = 10
# A bid at most this (0.001 credit) counts as low for the prefix watch: zero bids, and decoys
# that bid a micro-credit to get past a rule that counted only positive bids.
LOW_BID_MICROS = 1_000
SPEND_POINTS = 120
RECENT_REQUESTS = 20
ACCOUNT_CLEARING_POINTS = 300
# The user view forecasts the period's spend from this many charges of the period on.
FORECAST_CHARGES = 3


async def viewer(request: Request, state: State) -> UserInfo:
    """The caller: by API key when one is sent, otherwise by the dashboard session cookie."""
    if "authorization" in request.headers:
        return await current_user(request, state)
    token = request.cookies.get(COOKIE_NAME)
    if not token:
        raise Unauthenticated(
            "sign in at /dashboard, or send your API key as 'Authorization: Bearer <key>'",
            headers={"WWW-Authenticate": "Bearer"},
        )
    session = state.dashboard.sessions.get(token)
    if session is None:
        raise Unauthenticated(
            "the dashboard session ended or expired; sign in again",
            headers={"WWW-Authenticate": "Bearer"},
        )
    # Read afresh on every call, so a disabled user or a revoked admin right counts at once.
    user = await asyncio.to_thread(state.ledger.get_user, session.user)
    if user.disabled:
        state.dashboard.sessions.end(token)
        raise Forbidden(f"user {user.name!r} is disabled")
    if user.sessions_from is not None and session.signed_in_at <= user.sessions_from:
        state.dashboard.sessions.end(token)
        raise Unauthenticated(
            "the dashboard session ended (the key was rotated or the user disabled since); "
            "sign in again",
            headers={"WWW-Authenticate": "Bearer"},
        )
    state.limiter.check(user.name)
    return user


Viewer = Annotated[UserInfo, Depends(viewer)]


def _no_store(response: Response) -> None:
    # Balances must not outlive the page in any cache.
    response.headers["Cache-Control"] = "no-store"


@router.post("/session", summary="Sign in to the dashboard")
async def sign_in(
    request: Request, response: Response, user: CurrentUser, state: State
) -> dict[str, Any]:
    """Exchange the API key (sent once, as `Authorization: Bearer`) for a session cookie:
    HttpOnly, SameSite=Strict, expiring. The key itself is never stored or echoed."""
    token = state.dashboard.sessions.create(user.name, admin=user.is_admin)
    response.set_cookie(
        COOKIE_NAME,
        token,
        max_age=int(state.dashboard.sessions.ttl),
        path="/",
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
    )
    _no_store(response)
    return {**_identity(user), "expires_in_seconds": int(state.dashboard.sessions.ttl)}


@router.get("/session", summary="Who is signed in")
async def session(user: Viewer, state: State, response: Response) -> dict[str, Any]:
    """The signed-in user, whether it may see the operator view, and this replica's name."""
    _no_store(response)
    return {**_identity(user), "replica": replica_name(state)}


@router.delete("/session", summary="Sign out of the dashboard")
async def sign_out(request: Request, response: Response, state: State) -> dict[str, Any]:
    """End the cookie's session (if any) and clear the cookie; always succeeds."""
    token = request.cookies.get(COOKIE_NAME)
    if token:
        state.dashboard.sessions.end(token)
    response.delete_cookie(COOKIE_NAME, path="/", httponly=True, samesite="strict")
    return {"signed_in": False}


def _identity(user: UserInfo) -> dict[str, Any]:
    return {"user": user.name, "admin": user.is_admin}


@router.get("/account", summary="My account, as the dashboard draws it")
async def account(user: Viewer, state: State) -> Response:
    """Balance, spend over the budget period beside even pacing and its projection, request
    counts, recent requests, and charge against priority in recent batches. Kept a second for
    every caller of the same account; 429 once the account has spent its share of the server's
    time on this view."""
    body = await state.dashboard.accounts.get(user.name, partial(_account_body, state, user.name))
    return Response(body, media_type="application/json", headers={"Cache-Control": "no-store"})


def _account_body(state: AppState, name: str) -> bytes:
    """The account view's answer, rendered (in a worker thread: reads and rendering)."""
    activity = state.ledger.account_activity(
        name, points=SPEND_POINTS, recent=RECENT_REQUESTS, clearing=ACCOUNT_CLEARING_POINTS
    )
    return orjson.dumps(account_json(activity, datetime.now(UTC)))


@router.get("/market", summary="The market, as the operator's dashboard draws it")
async def market(user: Viewer, state: State, response: Response) -> dict[str, Any]:
    """Live queue, batch rate and sizes, clearing prices, revenue and welfare, cache hits and
    TTFT over the last 15 minutes, the top spenders, and the ledger's health (admin key)."""
    if not user.is_admin:
        raise Forbidden("the market view needs an admin API key")
    activity = await state.dashboard.market.get(
        partial(
            state.ledger.market_activity,
            MARKET_WINDOW,
            MARKET_BUCKET,
            points=CLEARING_POINTS,
            spenders=0,
        )
    )
    spenders = await state.dashboard.spenders.get(partial(state.ledger.top_spenders, TOP_SPENDERS))
    # Cached with the spenders' lifetime: one read of the window's requests every few seconds.
    squatters = await state.dashboard.squatters.get(
        partial(
            state.ledger.prefix_squatters,
            MARKET_WINDOW,
            low_bid_micros=LOW_BID_MICROS,
            limit=TOP_SPENDERS,
        )
    )
    _no_store(response)
    body = market_json(replace(activity, spenders=spenders), state, datetime.now(UTC))
    body["prefix_squatters"] = {
        "low_bid_micros": LOW_BID_MICROS,
        "accounts": [
            {
                "user": s.user,
                "low_bid_requests": s.low_bid_requests,
                "under_others": s.under_others,
                "other_users": s.other_users,
                "batches": s.batches,
            }
            for s in squatters
        ],
    }
    return body


def replica_name(state: AppState) -> str:
    """How this replica is labelled among several: its host name and configured port."""
    return f"{socket.gethostname()}:{state.settings.port}"


def _epoch(moment: datetime) -> float:
    return round(moment.timestamp(), 3)


def account_json(activity: AccountActivity, now: datetime) -> dict[str, Any]:
    """The user view's data."""
    name = activity.balance.user
    shares = request_shares(activity)
    budget = activity.budget_micros
    spent = activity.balance.spent_this_period_micros
    start, end = activity.period_start, activity.period_end
    pace = projection = None
    if end is not None:
        pace = {"t": [_epoch(start), _epoch(end)], "spent_micros": [0, budget]}
        since = activity.first_spend_at or now
        projection = _projection(spent, budget, since, end, now, activity.charges_this_period)
    return {
        "user": name,
        "balance": balance_json(activity.balance),
        "budget_micros": budget,
        "period": str(activity.period),
        "period_start": start.isoformat(),
        "period_end": end.isoformat() if end else None,
        "spend": _spend_json(activity),
        "pace": pace,
        "projection": projection,
        "requests": {
            "total": activity.requests_total,
            "served": activity.requests_served,
            "failed": activity.requests_failed,
            "abandoned": activity.requests_abandoned,
        },
        "recent": [
            {
                # The ledger keys requests as "<user>/<rid>"; the user knows the rid it sent.
                "rid": r.rid.removeprefix(name + "/"),
                "batch_id": r.batch_id,
                "closed_at": r.closed_at.isoformat(),
                "batch_size": r.batch_size,
                "position": r.position,
                "priority": r.priority,
                "bid_micros": r.bid_micros,
                "request_charge_micros": shares.get(r.rid, r.batch_charge_micros),
                "request_fee_micros": r.fee_micros,
                "batch_charge_micros": r.batch_charge_micros,
                "batch_refund_micros": r.batch_refund_micros,
                "status": str(r.status),
                "prompt_tokens": r.prompt_tokens,
                "cached_tokens": r.cached_tokens,
                "ttft_ms": r.ttft_ms,
            }
            for r in activity.recent
        ],
        "clearing": _clearing_json(activity.clearing, now),
    }


def _spend_json(activity: AccountActivity) -> dict[str, list[Any]]:
    # Flat at 0 until the user's first charge: the line from the period's start to the first
    # bucket would otherwise show spending from the start of the period.
    points = [(p.at, p.spent_micros) for p in activity.spend]
    first = activity.first_spend_at
    if first is not None and len(points) > 1 and points[0][0] < first < points[1][0]:
        points.insert(1, (first, 0))
    return {
        "t": [_epoch(at) for at, _ in points],
        "spent_micros": [spent for _, spent in points],
    }


def _projection(
    spent: int, budget: int, active_since: datetime, end: datetime, now: datetime, charges: int
) -> dict[str, Any]:
    """Where the period's spend ends if the user keeps spending at its rate so far, and when
    the budget runs out. The rate is taken over the user's own activity, from its first charge
    of the period (at least a minute), not over the whole period: a user who starts late in a
    day and spends fast is told so. Before `FORECAST_CHARGES` charges there is no rate to
    speak of (one charge, extrapolated over a day, "runs out" any budget): no forecast."""
    if charges < FORECAST_CHARGES and now < end:
        return {"at_period_end_micros": None, "budget_runs_out_at": None, "charges": charges}
    if spent <= 0 or now >= end:
        return {"at_period_end_micros": spent, "budget_runs_out_at": None, "charges": charges}
    elapsed = max(_micros_of(now - active_since), 60_000_000)
    left = _micros_of(end - now)
    at_end = spent + spent * left // elapsed
    runs_out = None
    if at_end > budget:
        until_out = max(0, budget - spent) * elapsed // spent
        runs_out = (now + timedelta(microseconds=until_out)).isoformat()
    return {"at_period_end_micros": at_end, "budget_runs_out_at": runs_out, "charges": charges}


def request_shares(activity: AccountActivity) -> dict[str, int]:
    """Each recent request's share of its user's batch charge (SPEC section 1), for the batches
    in which the user had several requests; a lone request's share is the whole charge."""
    name = activity.balance.user
    charges = {r.batch_id: r.batch_charge_micros for r in activity.recent}
    shares: dict[str, int] = {}
    for batch_id, priced in activity.shared_batches.items():
        if any(p.arrival is None or p.tree_path is None for p in priced):
            continue  # settled before the tree's shape was stored: no split to show
        repricer = settled_repricer(priced)
        positions = {p.rid: index for index, p in enumerate(priced)}
        shares.update(repricer.shares(name, charges[batch_id], positions))
    return shares


def _micros_of(delta: timedelta) -> int:
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def _clearing_json(points: list[ClearingPoint], now: datetime) -> dict[str, list[Any]]:
    return {
        "priority": [p.best_priority for p in points],
        "position": [p.best_position for p in points],
        "batch_size": [p.batch_size for p in points],
        "charge_micros": [p.charge_micros for p in points],
        "age_seconds": [round((now - p.closed_at).total_seconds(), 1) for p in points],
    }


def market_json(activity: MarketActivity, state: AppState, now: datetime) -> dict[str, Any]:
    """The operator view's data."""
    service = state.service
    seconds = activity.bucket_seconds
    buckets = activity.buckets
    queue, inflight = service.load()
    failed = _failed_writes(state)
    return {
        "now": now.isoformat(),
        "window_seconds": int((activity.until - activity.since).total_seconds()),
        "bucket_seconds": seconds,
        "replicas": [
            {
                "name": replica_name(state),
                "this": True,
                "up": True,
                "engine": service.engine_name,
                "queue": queue,
                "inflight": inflight,
            }
        ],
        "pricing": _pricing_json(state),
        "live": {
            "queue": queue,
            "inflight": inflight,
            "cache_hit_rate_since_start": round(service.metrics.cache_hit_rate_value(), 4),
        },
        "totals": {
            "batches": sum(b.batches for b in buckets),
            "requests": sum(b.requests for b in buckets),
            "revenue_micros": sum(b.revenue_micros for b in buckets),
            "fees_micros": sum(b.fees_micros for b in buckets),
            "floors_micros": sum(b.floors_micros for b in buckets),
            "welfare_micros": sum(b.welfare_micros for b in buckets),
            # By outcome so far; a request at the engine is in none of them yet.
            "served": sum(b.served for b in buckets),
            "failed": sum(b.failed for b in buckets),
            "abandoned": sum(b.abandoned for b in buckets),
        },
        "request_fee_micros": state.settings.request_fee_micros,
        "series": {
            "t": [_epoch(b.start) for b in buckets],
            "batches_per_second": [round(b.batches / seconds, 3) for b in buckets],
            "mean_batch_size": [
                round(b.requests / b.batches, 2) if b.batches else None for b in buckets
            ],
            "largest_batch": [b.largest_batch or None for b in buckets],
            "revenue_micros_per_minute": [b.revenue_micros * 60 // seconds for b in buckets],
            "fees_micros_per_minute": [b.fees_micros * 60 // seconds for b in buckets],
            "floors_micros_per_minute": [b.floors_micros * 60 // seconds for b in buckets],
            "welfare_micros_per_minute": [b.welfare_micros * 60 // seconds for b in buckets],
            "cache_hit_rate": [
                round(b.cached_tokens / b.prompt_tokens, 4) if b.prompt_tokens else None
                for b in buckets
            ],
            "ttft_mean_ms": [
                None if b.ttft_mean_ms is None else round(b.ttft_mean_ms, 2) for b in buckets
            ],
            "ttft_max_ms": [
                None if b.ttft_max_ms is None else round(b.ttft_max_ms, 2) for b in buckets
            ],
        },
        "clearing": _clearing_json(activity.clearing, now),
        "top_spenders": [
            {
                "user": s.user,
                "spent_micros": s.spent_micros,
                "budget_micros": s.budget_micros,
                "period": str(s.period),
                "period_start": s.period_start.isoformat(),
            }
            for s in activity.spenders
        ],
        "ledger": {
            "reconcile": _reconcile_json(state.dashboard.reconcile.status(state.ledger)),
            "open_holds": {
                "count": activity.holds.count,
                "amount_micros": activity.holds.amount_micros,
                "oldest": activity.holds.oldest.isoformat() if activity.holds.oldest else None,
            },
            "failed_writes": failed,
            "failed_writes_total": sum(failed.values()),
        },
    }


def _pricing_json(state: AppState) -> dict[str, Any]:
    """The pricing mode, under `tiers` each tier's price, recent priority and median wait, and
    the posted price floor now (`price_floor_micros`, null when off) with the entrants it aims
    at."""
    service = state.service
    menu = service.tier_menu
    tiers = (
        []
        if menu is None
        else [
            {
                "name": tier.name,
                "price_micros": tier.price_micros,
                "expected_priority_ppm": service.tier_figures.expected_priority_ppm(tier.name),
                "recent_wait_ms": service.tier_figures.recent_wait_ms(tier.name),
            }
            for tier in menu.tiers
        ]
    )
    floor = service.price_floor
    return {
        "mode": state.settings.pricing,
        "tiers": tiers,
        "price_floor_micros": None if floor is None else floor.micros,
        "price_floor_target": None if floor is None else floor.target,
    }


def _reconcile_json(status: ReconcileStatus) -> dict[str, Any]:
    report = status.report
    return {
        "finished_at": status.finished_at.isoformat() if status.finished_at else None,
        "running": status.running,
        "error": status.error,
        "ok": None if report is None else report.ok,
        "accounts_checked": None if report is None else report.accounts_checked,
        "drifted_users": [] if report is None else [d.user for d in report.drifts],
    }


def _failed_writes(state: AppState) -> dict[str, int]:
    """Ledger writes this process could not make since it started, by operation."""
    return state.service.metrics.ledger_error_counts()
