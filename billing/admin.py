"""Administrative operations, each recorded with who made it (`billing.audit`) in the same
transaction: the one code path behind the CLI and the HTTP admin API, so both follow the same
rules."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy.orm import Session

from inference_auctions.billing import audit, grants, keys, users
from inference_auctions.billing.keys import ApiKeyView, IssuedKey
from inference_auctions.billing.periods import require_aware
from inference_auctions.billing.postings import get_user
from inference_auctions.billing.users import UNSET, _Unset
from inference_auctions.billing.views import CreatedUser, EntryView, UserInfo


def create_user(
    session: Session,
    name: str,
    *,
    budget_micros: int,
    period: str,
    timezone: str,
    batch_cap_micros: int | None,
    admin: bool,
    requests_per_minute: int | None,
    tokens_per_minute: int | None,
    actor: str,
    now: datetime,
) -> CreatedUser:
    """Create a user (`billing.users.create_user`) and record it."""
    audit.check_actor(actor)
    created = users.create_user(
        session,
        name,
        budget_micros=budget_micros,
        period=period,
        timezone=timezone,
        batch_cap_micros=batch_cap_micros,
        admin=admin,
        requests_per_minute=requests_per_minute,
        tokens_per_minute=tokens_per_minute,
        now=now,
    )
    audit.record(
        session,
        actor=actor,
        action="create_user",
        user=name,
        now=now,
        budget_micros=budget_micros,
        period=period,
        timezone=timezone,
        batch_cap_micros=batch_cap_micros,
        admin=bool(admin),
        requests_per_minute=requests_per_minute,
        tokens_per_minute=tokens_per_minute,
    )
    return created


def set_disabled(
    session: Session, name: str, disabled: bool, *, actor: str, now: datetime
) -> UserInfo:
    """Disable or enable a user and record it."""
    audit.check_actor(actor)
    info = users.set_disabled(session, name, disabled, now if disabled else None)
    action = "disable_user" if disabled else "enable_user"
    audit.record(session, actor=actor, action=action, user=name, now=now)
    return info


def rotate_api_key(session: Session, name: str, *, actor: str, now: datetime) -> str:
    """Replace every key of the user with a new `default` one and record it."""
    audit.check_actor(actor)
    key = users.rotate_api_key(session, name, now)
    audit.record(session, actor=actor, action="rotate_key", user=name, now=now)
    return key


def create_api_key(
    session: Session,
    name: str,
    key_name: str,
    *,
    expires_at: datetime | None,
    actor: str,
    now: datetime,
) -> IssuedKey:
    """Give the user another named key, valid until `expires_at` (None: until revoked)."""
    audit.check_actor(actor)
    if expires_at is not None:
        require_aware(expires_at, "expires_at")
    issued = keys.issue_key(
        session, users.locked_user(session, name), key_name, expires_at=expires_at, now=now
    )
    audit.record(
        session,
        actor=actor,
        action="create_key",
        user=name,
        now=now,
        key_name=key_name,
        prefix=issued.key.prefix,
        expires_at=expires_at,
    )
    return issued


def revoke_api_key(
    session: Session, name: str, key_name: str, *, actor: str, now: datetime
) -> ApiKeyView:
    """Revoke the user's key named `key_name`, end the user's dashboard sessions, and record
    it."""
    audit.check_actor(actor)
    user = users.locked_user(session, name)
    revoked = keys.revoke_key(session, user, key_name, now=now)
    # Dashboard sessions do not say which key bought them: every one signed in before ends.
    user.sessions_from = now
    audit.record(
        session,
        actor=actor,
        action="revoke_key",
        user=name,
        now=now,
        key_name=key_name,
        prefix=revoked.prefix,
    )
    return revoked


def list_api_keys(session: Session, name: str, *, revoked: bool) -> list[ApiKeyView]:
    """The user's keys (reads only, so not recorded)."""
    return keys.list_keys(session, get_user(session, name), revoked=revoked)


def set_budget(
    session: Session,
    name: str,
    *,
    budget_micros: int | None,
    period: str | None,
    timezone: str | None,
    batch_cap_micros: int | _Unset | None,
    actor: str,
    now: datetime,
) -> UserInfo:
    """Change a budget (`billing.users.set_budget`) and record it."""
    audit.check_actor(actor)
    info = users.set_budget(
        session,
        name,
        budget_micros=budget_micros,
        period=period,
        timezone=timezone,
        batch_cap_micros=batch_cap_micros,
        now=now,
    )
    given: dict[str, object] = {
        field: value
        for field, value in (
            ("budget_micros", budget_micros),
            ("period", period),
            ("timezone", timezone),
        )
        if value is not None
    }
    if not isinstance(batch_cap_micros, _Unset):
        given["batch_cap_micros"] = batch_cap_micros
    audit.record(session, actor=actor, action="set_budget", user=name, now=now, **given)
    return info


def set_limits(
    session: Session,
    name: str,
    *,
    requests_per_minute: int | _Unset | None = UNSET,
    tokens_per_minute: int | _Unset | None = UNSET,
    actor: str,
    now: datetime,
) -> UserInfo:
    """Set the user's requests-per-minute and tokens-per-minute limits and record it."""
    audit.check_actor(actor)
    info = users.set_limits(
        session,
        name,
        requests_per_minute=requests_per_minute,
        tokens_per_minute=tokens_per_minute,
    )
    audit.record(
        session,
        actor=actor,
        action="set_limits",
        user=name,
        now=now,
        requests_per_minute=info.requests_per_minute,
        tokens_per_minute=info.tokens_per_minute,
    )
    return info


def grant(
    session: Session,
    name: str,
    start: datetime,
    amount_micros: int,
    *,
    reason: str | None,
    actor: str,
    now: datetime,
) -> EntryView:
    """Grant more to the current period (`billing.grants.grant`) and record it; a replay is
    not recorded again."""
    audit.check_actor(actor)
    entry = grants.grant(session, name, start, amount_micros, reason=reason, now=now)
    _record_new_entry(session, entry, actor=actor, action="grant", user=name, now=now)
    return entry


def adjust(
    session: Session,
    name: str,
    amount_micros: int,
    *,
    reason: str,
    key: str,
    actor: str,
    now: datetime,
) -> EntryView:
    """Correct a balance (`billing.grants.adjust`, idempotent by `key`) and record it; a
    replay is not recorded again."""
    audit.check_actor(actor)
    entry = grants.adjust(session, name, amount_micros, reason=reason, key=key, now=now)
    _record_new_entry(session, entry, actor=actor, action="adjust", user=name, now=now, key=key)
    return entry


def _record_new_entry(
    session: Session,
    entry: EntryView,
    *,
    actor: str,
    action: str,
    user: str,
    now: datetime,
    **details: object,
) -> None:
    """Record a grant or an adjustment, unless `entry` is one an earlier call made (a replay
    returns the entry it made then, created before `now`)."""
    if entry.created_at == now:
        audit.record(
            session,
            actor=actor,
            action=action,
            user=user,
            now=now,
            amount_micros=entry.amount_micros,
            entry_id=entry.id,
            reason=entry.reason,
            **details,
        )
