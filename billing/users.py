"""Users and their budgets: creation (with the first grant), API keys, disabling, budgets."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from inference_auctions.billing import apikeys
from inference_auctions.billing.errors import DuplicateUser
from inference_auctions.billing.grants import change_budget, post_period_grant
from inference_auctions.billing.models import Balance, Budget, User
from inference_auctions.billing.money import check_micros
from inference_auctions.billing.periods import Period, parse_period, parse_timezone, period_start
from inference_auctions.billing.postings import check_name, get_user, lock_account
from inference_auctions.billing.views import CreatedUser, UserInfo


class _Unset:
    """Marks an argument that was not given, where None is a meaningful value."""

    def __repr__(self) -> str:
        return "UNSET"


UNSET = _Unset()
# No SHA-256 hex digest is 64 "x" characters.
_NO_MATCH = "x" * 64


def user_info(user: User, budget: Budget) -> UserInfo:
    """The public view of a user row and its budget."""
    return UserInfo(
        name=user.name,
        is_admin=user.is_admin,
        disabled=user.disabled,
        created_at=user.created_at,
        budget_micros=budget.amount_micros,
        period=budget.period,
        timezone=budget.timezone,
        batch_cap_micros=budget.batch_cap_micros,
        pending_budget_micros=budget.pending_amount_micros,
        pending_period=budget.pending_period,
        pending_timezone=budget.pending_timezone,
        pending_from=budget.pending_from,
        sessions_from=user.sessions_from,
    )


def _check_cap(cap: int | None) -> int | None:
    return None if cap is None else check_micros(cap, "batch_cap_micros", positive=True)


def create_user(
    session: Session,
    name: str,
    *,
    budget_micros: int,
    period: str,
    timezone: str,
    batch_cap_micros: int | None,
    admin: bool,
    now: datetime,
) -> CreatedUser:
    """Create a user with a fresh API key, a budget, and the grant of the current period."""
    check_name(name)
    check_micros(budget_micros, "budget_micros")
    budget_period = parse_period(period)
    tz = parse_timezone(timezone)
    _check_cap(batch_cap_micros)
    if session.scalar(select(User.id).where(User.name == name)) is not None:
        raise DuplicateUser(name)
    key = apikeys.generate_key()
    user = User(
        name=name,
        api_key_prefix=key.prefix,
        api_key_hash=key.digest,
        is_admin=bool(admin),
        disabled=False,
        created_at=now,
    )
    session.add(user)
    session.flush()
    start = now if budget_period is Period.NONE else period_start(now, budget_period, tz)
    budget = Budget(
        user_id=user.id,
        amount_micros=budget_micros,
        period=budget_period,
        timezone=timezone,
        batch_cap_micros=batch_cap_micros,
        current_period_start=start,
        updated_at=now,
    )
    session.add_all(
        [budget, Balance(user_id=user.id, balance_micros=0, held_micros=0, updated_at=now)]
    )
    session.flush()
    post_period_grant(session, lock_account(session, name), budget, start, now=now)
    return CreatedUser(user=user_info(user, budget), api_key=key.key)


def budget_of(session: Session, user: User) -> Budget:
    """The budget row of `user` (every user has one)."""
    budget = session.get(Budget, user.id)
    assert budget is not None, f"user {user.name!r} has no budget row"
    return budget


def authenticate(session: Session, api_key: str) -> UserInfo | None:
    """The user whose API key this is, or None; disabled users are returned with the flag set."""
    if not isinstance(api_key, str):
        return None
    prefix = apikeys.key_prefix(api_key)
    user = (
        None
        if prefix is None
        else session.scalar(select(User).where(User.api_key_prefix == prefix))
    )
    # Hash and compare even without a match, so timing does not tell which prefixes exist.
    valid = apikeys.matches(api_key, user.api_key_hash if user is not None else _NO_MATCH)
    if user is None or not valid:
        return None
    return user_info(user, budget_of(session, user))


def get_user_info(session: Session, name: str) -> UserInfo:
    """The user named `name`."""
    user = get_user(session, name)
    return user_info(user, budget_of(session, user))


def list_users(session: Session) -> list[UserInfo]:
    """Every user, by name."""
    rows = session.execute(
        select(User, Budget).join(Budget, Budget.user_id == User.id).order_by(User.name)
    ).all()
    return [user_info(user, budget) for user, budget in rows]


def set_disabled(
    session: Session, name: str, disabled: bool, now: datetime | None = None
) -> UserInfo:
    """Disable or re-enable a user; open holds stay and settle normally. Disabling ends the
    user's dashboard sessions for good (`sessions_from`)."""
    user = _locked_user(session, name)
    user.disabled = disabled
    if disabled and now is not None:
        user.sessions_from = now
    return user_info(user, budget_of(session, user))


def rotate_api_key(session: Session, name: str, now: datetime | None = None) -> str:
    """Replace the user's API key; the old one and the dashboard sessions it bought stop
    working. Returns the new key, shown once."""
    user = _locked_user(session, name)
    if now is not None:
        user.sessions_from = now
    key = apikeys.generate_key()
    user.api_key_prefix = key.prefix
    user.api_key_hash = key.digest
    return key.key


def _locked_user(session: Session, name: str) -> User:
    """The user row of `name`, its account locked first (as every write to it does)."""
    user = session.get(User, lock_account(session, name).user_id, populate_existing=True)
    assert user is not None
    return user


def set_budget(
    session: Session,
    name: str,
    *,
    budget_micros: int | None,
    period: str | None,
    timezone: str | None,
    batch_cap_micros: int | _Unset | None,
    now: datetime,
) -> UserInfo:
    """Change a budget: the batch cap at once, the rest at the next period boundary.

    A lifetime budget's new amount applies at once (see `billing.grants.change_budget`).
    """
    if budget_micros is not None:
        check_micros(budget_micros, "budget_micros")
    new_period = None if period is None else parse_period(period)
    if timezone is not None:
        parse_timezone(timezone)
    if not isinstance(batch_cap_micros, _Unset):
        _check_cap(batch_cap_micros)
    account = lock_account(session, name)
    budget = change_budget(
        session,
        account,
        amount_micros=budget_micros,
        period=new_period,
        timezone=timezone,
        now=now,
    )
    if not isinstance(batch_cap_micros, _Unset):
        budget.batch_cap_micros = batch_cap_micros
    return user_info(_locked_user(session, name), budget)
