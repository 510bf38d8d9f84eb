"""The record of administrative actions: who created, enabled, disabled a user, issued or
revoked a key, changed a budget or a limit, granted or adjusted money, and with what.

Each action is written in the transaction that makes it, so the record can neither miss a
change nor show one that was rolled back. Keys never enter it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from inference_auctions.billing.errors import InvalidInput
from inference_auctions.billing.models import ID_LENGTH, AdminAction

# What `Ledger` records when its caller does not say who it is (a script using the library).
LIBRARY_ACTOR = "library"
MAX_PAGE = 1000


@dataclass(frozen=True, slots=True)
class AdminActionView:
    """One recorded administrative action."""

    id: int
    at: datetime
    actor: str
    action: str
    user: str | None
    details: dict[str, Any]


def check_actor(actor: object) -> str:
    """Return `actor` if it can be recorded."""
    if not isinstance(actor, str) or not actor or len(actor) > ID_LENGTH:
        raise InvalidInput("actor", f"must be a non-empty string of at most {ID_LENGTH} characters")
    return actor


def record(
    session: Session,
    *,
    actor: str,
    action: str,
    user: str | None,
    now: datetime,
    **details: Any,
) -> None:
    """Record `action` on `user` by `actor` in the caller's transaction."""
    session.add(
        AdminAction(
            at=now,
            actor=check_actor(actor),
            action=action,
            user_name=user,
            details=json.dumps(details, sort_keys=True, default=_jsonable),
        )
    )


def _jsonable(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    return str(value)


def list_actions(
    session: Session, *, user: str | None, after_id: int, limit: int
) -> list[AdminActionView]:
    """Actions in the order they were made, after `after_id`, of `user` or of everyone."""
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_PAGE:
        raise InvalidInput("limit", f"must be an integer from 1 to {MAX_PAGE}")
    if isinstance(after_id, bool) or not isinstance(after_id, int) or not 0 <= after_id < 2**63:
        raise InvalidInput("after_id", "must be an action's id, an integer from 0 to 2**63 - 1")
    query = select(AdminAction).where(AdminAction.id > after_id)
    if user is not None:
        query = query.where(AdminAction.user_name == user)
    rows = session.scalars(query.order_by(AdminAction.id).limit(limit))
    return [
        AdminActionView(
            id=row.id,
            at=row.at,
            actor=row.actor,
            action=row.action,
            user=row.user_name,
            details=json.loads(row.details),
        )
        for row in rows
    ]
