"""What a pacing client needs from the server: its budget period, its spend since a moment,
and what places in the queue have recently cost. Money as integer `*_micros`."""

from __future__ import annotations

import asyncio
import statistics
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any

from fastapi import APIRouter, Query

from inference_auctions.billing import ClearingSample, Ledger
from inference_auctions.server.api.deps import CurrentUser, State
from inference_auctions.server.errors import InvalidRequest

router = APIRouter(prefix="/v1", tags=["pacing"])

# Priority bands of the price table: the top quarter of a batch's schedule first.
_BANDS = ((0.75, 1.0), (0.5, 0.75), (0.25, 0.5), (0.0, 0.25))
# The fewest users a published figure may draw on: no answer reveals one user's batch.
MIN_USERS = 3


def _budget_view(ledger: Ledger, name: str) -> dict[str, Any]:
    user = ledger.get_user(name)
    balance = ledger.balance(name)
    now = datetime.now(UTC)
    end = balance.period_end  # the ledger's schedule, a pending change of it included
    auctions = ledger.auctions_since(name, balance.period_start)
    spent = balance.spent_this_period_micros
    return {
        "user": name,
        "period": str(user.period),
        "timezone": user.timezone,
        "period_start": balance.period_start.isoformat(),
        "period_end": None if end is None else end.isoformat(),
        "now": now.isoformat(),
        "seconds_left": None if end is None else max(0.0, (end - now).total_seconds()),
        "grant_micros": user.budget_micros,
        "spent_micros": spent,
        "remaining_micros": max(0, user.budget_micros - spent),
        "balance_micros": balance.balance_micros,
        "held_micros": balance.held_micros,
        "available_micros": balance.available_micros,
        "auctions": auctions,
    }


@router.get("/budget", summary="My budget period: grant, spent so far, time left")
async def budget(user: CurrentUser, state: State) -> dict[str, Any]:
    """The current budget period and its figures; every process of a user reads the same.
    `request_fee_micros`: the fee every request pays, which a pacing client reserves."""
    view = await asyncio.to_thread(_budget_view, state.ledger, user.name)
    return {**view, "request_fee_micros": state.settings.request_fee_micros}


def _spend_view(ledger: Ledger, name: str, since: datetime) -> dict[str, Any]:
    spend = ledger.spend_since(name, since)
    balance = ledger.balance(name)
    return {
        "since": spend.since.isoformat(),
        "now": datetime.now(UTC).isoformat(),
        "spent_micros": spend.spent_micros,
        "held_micros": balance.held_micros,
        "auctions": spend.auctions,
    }


@router.get("/spend", summary="My spend and auctions since a moment")
async def spend(user: CurrentUser, state: State, since: datetime) -> dict[str, Any]:
    """Charges and request fees net of refunds since `since`, the bids (and fees) held now,
    auctions taken part in, and the request fee (`request_fee_micros`)."""
    if since.tzinfo is None:
        raise InvalidRequest(
            "since: must carry a time zone, e.g. 2030-01-01T00:00:00Z", param="since"
        )
    since = since.astimezone(UTC)
    if since > datetime.now(UTC) + timedelta(minutes=5):
        raise InvalidRequest("since: must not lie in the future", param="since")
    view = await asyncio.to_thread(_spend_view, state.ledger, user.name, since)
    return {**view, "request_fee_micros": state.settings.request_fee_micros}


def _quantile(values: Sequence[float], q: float) -> float | None:
    if not values:
        return None
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[round(q * 100) - 1]


def prices_json(samples: list[ClearingSample], since: datetime, now: datetime) -> dict[str, Any]:
    """The price table: charge per unit of priority overall, and charge per request by band.
    A figure drawn from fewer than `MIN_USERS` users is null (its sample count stays)."""
    priced = [s for s in samples if s.priority > 0]
    shown = _enough_users(priced)
    per_unit = sorted(s.charge_micros / s.priority for s in priced) if shown else []
    total_priority = sum(s.priority for s in priced) if shown else 0
    total_charge = sum(s.charge_micros for s in priced)
    # A user's only request in a batch of two or more says what one request at that priority
    # cost; a batch of one has nobody to pass (priority 1, charge 0) and says nothing.
    single = [s for s in samples if s.requests == 1 and s.batch_size >= 2]
    bands = []
    for low, high in _BANDS:
        band = [
            s for s in single if low <= s.priority < high or (high == 1.0 and s.priority == 1.0)
        ]
        charges = sorted(float(s.charge_micros) for s in band) if _enough_users(band) else []
        bands.append(
            {
                "priority_min": low,
                "priority_max": high,
                "samples": len(band),
                "median_charge_micros": _micros(_quantile(charges, 0.5)),
                "p90_charge_micros": _micros(_quantile(charges, 0.9)),
            }
        )
    return {
        "since": since.isoformat(),
        "until": now.isoformat(),
        "batches": len({s.batch_id for s in samples}),
        "samples": len(priced),
        "charge_per_priority_micros": {
            "mean": _micros(total_charge / total_priority if total_priority else None),
            "p10": _micros(_quantile(per_unit, 0.1)),
            "p50": _micros(_quantile(per_unit, 0.5)),
            "p90": _micros(_quantile(per_unit, 0.9)),
        },
        "by_priority": bands,
    }


def _enough_users(samples: Sequence[ClearingSample]) -> bool:
    return len({s.user_id for s in samples}) >= MIN_USERS


def _micros(value: float | None) -> int | None:
    # Prices are statistics of integer charges; rounding them keeps the money integral.
    return None if value is None else round(value)


@router.get("/market/prices", summary="What places in the queue have recently cost")
async def prices(
    user: CurrentUser,
    state: State,
    window_seconds: Annotated[int, Query(ge=1, le=7 * 24 * 3600)] = 3600,
    max_batches: Annotated[int, Query(ge=1, le=10_000)] = 1000,
) -> dict[str, Any]:
    """Recent charge per unit of priority (the whole schedule is 1 per batch), from cleared
    batches of all users; no user is named, and no figure drawn from fewer than `MIN_USERS`
    users is published; answered from an aggregate in memory (`server.api.market_prices`).
    `request_fee_micros`: the fee every request pays on top of these charges."""
    answer = await state.market_prices.answer(user.name, window_seconds, max_batches)
    return {**answer, "request_fee_micros": state.settings.request_fee_micros}
