"""A user's API keys: several per user, each with a name, an optional expiry, and revocation.

A key reads `iak_<prefix>_<secret>` (`billing.apikeys`); its row keeps the prefix, to find it,
and the hash of the whole key. A revoked key's row stays, so the record of who held which key
when outlives the key.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from inference_auctions.billing import apikeys
from inference_auctions.billing.errors import DuplicateApiKey, InvalidInput, UnknownApiKey
from inference_auctions.billing.models import ApiKey, User
from inference_auctions.billing.periods import require_aware
from inference_auctions.billing.postings import check_name

DEFAULT_KEY_NAME = "default"
# No SHA-256 hex digest is 64 "x" characters.
_NO_MATCH = "x" * 64


@dataclass(frozen=True, slots=True)
class ApiKeyView:
    """One of a user's API keys, never the key itself: `prefix` is the part after `iak_` that
    names it in logs."""

    user: str
    name: str
    prefix: str
    created_at: datetime
    expires_at: datetime | None
    revoked_at: datetime | None

    def usable(self, now: datetime) -> bool:
        """Whether the key authenticates at `now`."""
        return self.revoked_at is None and (self.expires_at is None or now < self.expires_at)


@dataclass(frozen=True, slots=True)
class IssuedKey:
    """A key just made: `api_key` is shown this once."""

    key: ApiKeyView
    api_key: str = field(repr=False)


def _view(row: ApiKey, user: str) -> ApiKeyView:
    return ApiKeyView(
        user=user,
        name=row.name,
        prefix=row.key_prefix,
        created_at=row.created_at,
        expires_at=row.expires_at,
        revoked_at=row.revoked_at,
    )


def _active(session: Session, user: User, key_name: str) -> ApiKey | None:
    return session.scalar(
        select(ApiKey).where(
            ApiKey.user_id == user.id, ApiKey.name == key_name, ApiKey.revoked_at.is_(None)
        )
    )


def issue_key(
    session: Session, user: User, key_name: str, *, expires_at: datetime | None, now: datetime
) -> IssuedKey:
    """Make a new key named `key_name` for `user` (no other unrevoked key may have the name)."""
    check_name(key_name, "key_name")
    if expires_at is not None and require_aware(expires_at, "expires_at") <= now:
        raise InvalidInput("expires_at", f"{expires_at.isoformat()} has already passed")
    if _active(session, user, key_name) is not None:
        raise DuplicateApiKey(user.name, key_name)
    new = apikeys.generate_key()
    row = ApiKey(
        user_id=user.id,
        name=key_name,
        key_prefix=new.prefix,
        key_hash=new.digest,
        created_at=now,
        expires_at=expires_at,
        revoked_at=None,
    )
    session.add(row)
    session.flush()
    return IssuedKey(key=_view(row, user.name), api_key=new.key)


def revoke_key(session: Session, user: User, key_name: str, *, now: datetime) -> ApiKeyView:
    """Revoke the unrevoked key of `user` named `key_name`."""
    row = _active(session, user, key_name)
    if row is None:
        raise UnknownApiKey(user.name, key_name)
    row.revoked_at = now
    return _view(row, user.name)


def revoke_all(session: Session, user: User, *, now: datetime) -> list[str]:
    """Revoke every unrevoked key of `user`; the names of those revoked."""
    rows = session.scalars(
        select(ApiKey).where(ApiKey.user_id == user.id, ApiKey.revoked_at.is_(None))
    ).all()
    for row in rows:
        row.revoked_at = now
    return sorted(row.name for row in rows)


def list_keys(session: Session, user: User, *, revoked: bool) -> list[ApiKeyView]:
    """The keys of `user` in the order they were made (the revoked ones too if `revoked`)."""
    query = select(ApiKey).where(ApiKey.user_id == user.id)
    if not revoked:
        query = query.where(ApiKey.revoked_at.is_(None))
    return [_view(row, user.name) for row in session.scalars(query.order_by(ApiKey.id))]


def key_owner(session: Session, api_key: str, now: datetime) -> User | None:
    """The user whose usable key `api_key` is, or None (unknown, wrong, revoked or expired)."""
    if not isinstance(api_key, str):
        return None
    prefix = apikeys.key_prefix(api_key)
    row = (
        None
        if prefix is None
        else session.execute(
            select(ApiKey, User)
            .join(User, User.id == ApiKey.user_id)
            .where(ApiKey.key_prefix == prefix)
        ).first()
    )
    # Hash and compare even without a match, so timing does not tell which prefixes exist.
    valid = apikeys.matches(api_key, row[0].key_hash if row is not None else _NO_MATCH)
    if row is None or not valid:
        return None
    key, user = row
    if key.revoked_at is not None or (key.expires_at is not None and now >= key.expires_at):
        return None
    return user
