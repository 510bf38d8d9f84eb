"""Admin endpoints for access (admin key only): enabling a user, its API keys, its rate limits,
and the record of every administrative action. Each change goes through the same ledger
operation as the CLI's and is recorded with the admin's name."""

from __future__ import annotations

import asyncio
from datetime import datetime
from functools import partial
from typing import Annotated, Any

from fastapi import APIRouter, Path, Query, Request
from pydantic import BaseModel, ConfigDict, Field

from inference_auctions.billing import AdminActionView, ApiKeyView
from inference_auctions.server.api.admin_routes import UserName, user_json
from inference_auctions.server.api.bodies import parse_body
from inference_auctions.server.api.deps import AdminUser, State
from inference_auctions.server.errors import InvalidRequest

router = APIRouter(prefix="/v1/admin", tags=["admin"])
KeyName = Annotated[str, Path(min_length=1, max_length=64)]


class NewApiKey(BaseModel):
    """Another API key for a user: a name to tell it apart, and when it stops working."""

    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1, max_length=64)
    expires_at: datetime | None = None


class RateLimits(BaseModel):
    """A user's own limits per minute; null removes one, an omitted field stays as it is."""

    model_config = ConfigDict(extra="forbid")
    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None


def key_json(key: ApiKeyView) -> dict[str, Any]:
    """A key as JSON (its prefix, never the key)."""
    return {
        "user": key.user,
        "name": key.name,
        "prefix": key.prefix,
        "created_at": key.created_at.isoformat(),
        "expires_at": None if key.expires_at is None else key.expires_at.isoformat(),
        "revoked_at": None if key.revoked_at is None else key.revoked_at.isoformat(),
    }


def action_json(action: AdminActionView) -> dict[str, Any]:
    """A recorded action as JSON."""
    return {
        "id": action.id,
        "at": action.at.isoformat(),
        "actor": action.actor,
        "action": action.action,
        "user": action.user,
        "details": action.details,
    }


def _body_schema(model: type[BaseModel]) -> dict[str, Any]:
    return {
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": model.model_json_schema()}},
        }
    }


@router.post("/users/{name}/enable")
async def enable_user(name: UserName, admin: AdminUser, state: State) -> dict[str, Any]:
    """Accept the user's requests again."""
    enable = partial(state.ledger.enable_user, name, actor=admin.name)
    return user_json(await asyncio.to_thread(enable))


@router.post("/users/{name}/rotate-key")
async def rotate_key(name: UserName, admin: AdminUser, state: State) -> dict[str, Any]:
    """Revoke every key of the user and issue one named `default`, shown only in this
    answer."""
    key = await asyncio.to_thread(partial(state.ledger.rotate_api_key, name, actor=admin.name))
    return {"user": name, "name": "default", "api_key": key}


@router.get("/users/{name}/keys")
async def list_keys(
    name: UserName, _: AdminUser, state: State, revoked: bool = False
) -> dict[str, Any]:
    """The user's keys, oldest first (`?revoked=true`: the revoked ones too)."""
    keys = await asyncio.to_thread(partial(state.ledger.api_keys, name, revoked=revoked))
    return {"keys": [key_json(key) for key in keys]}


@router.post("/users/{name}/keys", status_code=201, openapi_extra=_body_schema(NewApiKey))
async def create_key(
    name: UserName, request: Request, admin: AdminUser, state: State
) -> dict[str, Any]:
    """Give the user another named key; the answer holds it, and it is never shown again."""
    body = await parse_body(request, NewApiKey)
    if body.expires_at is not None and body.expires_at.tzinfo is None:
        raise InvalidRequest(
            "expires_at: give a time zone (for instance 2027-01-01T00:00:00Z)",
            param="expires_at",
        )
    issued = await asyncio.to_thread(
        partial(
            state.ledger.create_api_key,
            name,
            body.name,
            expires_at=body.expires_at,
            actor=admin.name,
        )
    )
    return {**key_json(issued.key), "api_key": issued.api_key}


@router.delete("/users/{name}/keys/{key_name}")
async def revoke_key(
    name: UserName, key_name: KeyName, admin: AdminUser, state: State
) -> dict[str, Any]:
    """Revoke the user's key named `key_name`; it stops working within seconds (running
    servers remember a key's user for 2 s)."""
    revoke = partial(state.ledger.revoke_api_key, name, key_name, actor=admin.name)
    return key_json(await asyncio.to_thread(revoke))


@router.put("/users/{name}/limits", openapi_extra=_body_schema(RateLimits))
async def set_limits(
    name: UserName, request: Request, admin: AdminUser, state: State
) -> dict[str, Any]:
    """Set the user's requests-per-minute and tokens-per-minute limits."""
    body = await parse_body(request, RateLimits)
    given = body.model_dump(include=body.model_fields_set)
    user = await asyncio.to_thread(
        partial(state.ledger.set_rate_limits, name, actor=admin.name, **given)
    )
    return user_json(user)


@router.get("/actions")
async def list_actions(
    _: AdminUser,
    state: State,
    user: Annotated[str | None, Query(min_length=1, max_length=64)] = None,
    after: Annotated[int, Query(ge=0, lt=2**63)] = 0,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> dict[str, Any]:
    """Recorded administrative actions, oldest first: page on with `after` (the last `id`)."""
    actions = await asyncio.to_thread(
        partial(state.ledger.admin_actions, user=user, after_id=after, limit=limit)
    )
    return {"actions": [action_json(action) for action in actions]}
