"""Admin endpoints that move money (admin key only): an extra grant for the current period
and a signed adjustment, idempotent by a key as `ledger adjust --key` is. Both are the CLI's
ledger operations, recorded with the admin's name."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from functools import partial
from typing import Any

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field

from inference_auctions import billing
from inference_auctions.billing import EntryRecord, EntryView, format_micros, parse_credits
from inference_auctions.server.api.admin_routes import UserName
from inference_auctions.server.api.bodies import parse_body
from inference_auctions.server.api.deps import AdminUser, State
from inference_auctions.server.errors import Conflict, InvalidRequest

router = APIRouter(prefix="/v1/admin", tags=["admin"])


class Grant(BaseModel):
    """More credits for the user's current period (once per period)."""

    model_config = ConfigDict(extra="forbid")
    amount: Any
    reason: str | None = Field(default=None, min_length=1, max_length=500)


class Adjustment(BaseModel):
    """A correction of a balance; `key` makes a retry count once."""

    model_config = ConfigDict(extra="forbid")
    amount: Any
    debit: bool = False
    reason: str = Field(min_length=1, max_length=500)
    key: str = Field(min_length=1, max_length=293)


def _body_schema(model: type[BaseModel]) -> dict[str, Any]:
    return {
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": model.model_json_schema()}},
        }
    }


def _entry_json(entry: EntryView) -> dict[str, Any]:
    return EntryRecord.of(entry).as_json()


@router.post("/users/{name}/grant", openapi_extra=_body_schema(Grant))
async def grant(name: UserName, request: Request, admin: AdminUser, state: State) -> dict[str, Any]:
    """Grant more to the user's current period; a retry in the same period with the same
    amount answers the first grant, another amount is a 409."""
    body = await parse_body(request, Grant)
    amount = parse_credits(body.amount, "amount")
    now = datetime.now(UTC)
    try:
        entry = await asyncio.to_thread(
            partial(state.ledger.grant, name, now, amount, reason=body.reason, actor=admin.name)
        )
    except billing.IdempotencyConflict as conflict:
        raise Conflict(
            f"user {name!r} was already granted extra credits this period, another amount"
            f" ({conflict.detail}); adjust the balance instead",
            param="amount",
        ) from None
    return {**_entry_json(entry), "replayed": entry.created_at < now}


@router.post("/users/{name}/adjust", openapi_extra=_body_schema(Adjustment))
async def adjust(
    name: UserName, request: Request, admin: AdminUser, state: State
) -> dict[str, Any]:
    """Correct the user's balance by `amount` credits (taken away with `debit`); the same
    `key` again answers the first adjustment, other values under it are a 409."""
    body = await parse_body(request, Adjustment)
    amount = parse_credits(body.amount, "amount")
    signed = -amount if body.debit else amount
    started = datetime.now(UTC)
    try:
        entry = await asyncio.to_thread(
            partial(
                state.ledger.adjust,
                name,
                signed,
                reason=body.reason,
                key=body.key,
                actor=admin.name,
            )
        )
    except billing.IdempotencyConflict as conflict:
        raise Conflict(
            f"key {body.key!r} already adjusted {name!r} with other values ({conflict.detail})",
            param="key",
        ) from None
    except billing.InsufficientFunds as short:
        raise InvalidRequest(
            f"amount: user {name!r} has {format_micros(short.available_micros)} credits"
            f" available, less than the {format_micros(short.requested_micros)} to debit",
            param="amount",
        ) from None
    return {**_entry_json(entry), "replayed": entry.created_at < started}
