"""Admin endpoints (admin key only): users, budgets, any user's balance, reconciliation."""

from __future__ import annotations

import asyncio
from functools import partial
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Path, Request
from pydantic import BaseModel, ConfigDict, Field

from inference_auctions.billing import ReconcileRecord, UserInfo, parse_credits
from inference_auctions.server.api.bodies import parse_body
from inference_auctions.server.api.deps import AdminUser, State
from inference_auctions.server.api.ledger_routes import balance_json
from inference_auctions.server.cluster.replica import replica_name

router = APIRouter(prefix="/v1/admin", tags=["admin"])
UserName = Annotated[str, Path(min_length=1, max_length=64)]


class NewUser(BaseModel):
    """A user to create; `budget` in credits per period, a day unless told (the SDK paces a
    period; `none`, a lifetime budget, needs a plan of the client's own)."""

    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1, max_length=64)
    budget: Any = "0"
    period: Literal["none", "day", "week", "month"] = "day"
    timezone: str = "UTC"
    batch_cap: Any = None
    admin: bool = False


class BudgetChange(BaseModel):
    """Budget fields to change; omitted fields stay as they are."""

    model_config = ConfigDict(extra="forbid")
    budget: Any = None
    period: Literal["none", "day", "week", "month"] | None = None
    timezone: str | None = None


def user_json(user: UserInfo) -> dict[str, Any]:
    """A user as JSON (never the key)."""
    return {
        "name": user.name,
        "admin": user.is_admin,
        "disabled": user.disabled,
        "budget_micros": user.budget_micros,
        "period": str(user.period),
        "timezone": user.timezone,
        "batch_cap_micros": user.batch_cap_micros,
        # The user's own rate limits (None: only the server-wide one applies).
        "requests_per_minute": user.requests_per_minute,
        "tokens_per_minute": user.tokens_per_minute,
        "created_at": user.created_at.isoformat(),
        # A budget change that waits for the next period boundary (all None when there is none).
        "pending_budget_micros": user.pending_budget_micros,
        "pending_period": None if user.pending_period is None else str(user.pending_period),
        "pending_timezone": user.pending_timezone,
        "pending_from": None if user.pending_from is None else user.pending_from.isoformat(),
    }


@router.post(
    "/users",
    status_code=201,
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": NewUser.model_json_schema()}},
        }
    },
)
async def create_user(request: Request, admin: AdminUser, state: State) -> dict[str, Any]:
    """Create a user; the response holds its API key, which is never shown again."""
    body = await parse_body(request, NewUser)
    budget = parse_credits(body.budget, "budget")
    cap = None if body.batch_cap is None else parse_credits(body.batch_cap, "batch_cap")
    created = await asyncio.to_thread(
        partial(
            state.ledger.create_user,
            body.name,
            budget_micros=budget,
            period=body.period,
            timezone=body.timezone,
            batch_cap_micros=cap,
            admin=body.admin,
            actor=admin.name,
        )
    )
    return {**user_json(created.user), "api_key": created.api_key}


@router.get("/users")
async def list_users(_: AdminUser, state: State) -> dict[str, Any]:
    """Every user."""
    users = await asyncio.to_thread(state.ledger.list_users)
    return {"users": [user_json(user) for user in users]}


@router.post("/users/{name}/disable")
async def disable_user(name: UserName, admin: AdminUser, state: State) -> dict[str, Any]:
    """Disable a user: its keys stop working and it can place no new holds."""
    disable = partial(state.ledger.disable_user, name, actor=admin.name)
    return user_json(await asyncio.to_thread(disable))


@router.put(
    "/users/{name}/budget",
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": BudgetChange.model_json_schema()}},
        }
    },
)
async def set_budget(
    name: UserName, request: Request, admin: AdminUser, state: State
) -> dict[str, Any]:
    """Change a user's budget."""
    body = await parse_body(request, BudgetChange)
    budget = None if body.budget is None else parse_credits(body.budget, "budget")
    user = await asyncio.to_thread(
        partial(
            state.ledger.set_budget,
            name,
            budget_micros=budget,
            period=body.period,
            timezone=body.timezone,
            actor=admin.name,
        )
    )
    return user_json(user)


@router.get("/users/{name}/balance")
async def user_balance(name: UserName, _: AdminUser, state: State) -> dict[str, Any]:
    """Any user's balance."""
    return balance_json(await asyncio.to_thread(state.ledger.balance, name))


@router.get("/reconcile")
async def reconcile(_: AdminUser, state: State) -> dict[str, Any]:
    """Check every balance against the sum of its entries (every replica's: the ledger's)."""
    report = await asyncio.to_thread(state.ledger.reconcile)
    # The CLI's record, and the scope: the ledger's, so every replica answers the same.
    return {**ReconcileRecord.of(report).as_json(), "scope": "deployment"}


@router.get("/timings")
async def timings(_: AdminUser, state: State) -> dict[str, Any]:
    """Percentiles of the auction layer's overhead and of the batching wait (recent requests
    of this replica only: the answer says which)."""
    samples = state.service.recent_timings()

    def percentiles(values: list[float]) -> dict[str, float | None]:
        ordered = sorted(values)

        def pick(q: float) -> float | None:
            if not ordered:
                return None
            return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000, 3)

        keys = {"p50_ms": 0.5, "p90_ms": 0.9, "p99_ms": 0.99, "max_ms": 1.0}
        return {name: pick(q) for name, q in keys.items()}

    return {
        "requests": len(samples),
        "overhead": percentiles([overhead for overhead, _ in samples]),
        "batching_wait": percentiles([wait for _, wait in samples]),
        "scope": "replica",
        "replica": replica_name(state.settings),
    }
