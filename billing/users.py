"""Users and their budgets: creation (with the first grant and key), authentication,
disabling, budgets, rate limits."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from inference_auctions.billing import keys
from inference_auctions.billing.errors import DuplicateUser, InvalidInput
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
# A limit above this is no limit anyone means; it also keeps the columns' values small.
MAX_REQUESTS_PER_MINUTE = 1_000_000
MAX_TOKENS_PER_MINUTE = 10**12


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
        requests_per_minute=user.requests_per_minute,
        tokens_per_minute=user.tokens_per_minute,
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
    requests_per_minute: int | None = None,
    tokens_per_minute: int | None = None,
) -> CreatedUser:
    """Create a user with a fresh API key (named `default`), a budget, and the grant of the
    current period."""
    check_name(name)
    check_micros(budget_micros, "budget_micros")
    budget_period = parse_period(period)
    tz = parse_timezone(timezone)
    _check_cap(batch_cap_micros)
    check_limits(requests_per_minute, tokens_per_minute)
    if session.scalar(select(User.id).where(User.name == name)) is not None:
        raise DuplicateUser(name)
    user = User(
        name=name,
        is_admin=bool(admin),
        disabled=False,
        created_at=now,
        requests_per_minute=requests_per_minute,
        tokens_per_minute=tokens_per_minute,
    )
    session.add(user)
    session.flush()
    issued = keys.issue_key(session, user, keys.DEFAULT_KEY_NAME, expires_at=None, now=now)
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
    return CreatedUser(user=user_info(user, budget), api_key=issued.api_key)


def budget_of(session: Session, user: User) -> Budget:
    """The budget row of `user` (every user has one)."""
    budget = session.get(Budget, user.id)
    assert budget is not None, f"user {user.name!r} has no budget row"
    return budget


def authenticate(session: Session, api_key: str, now: datetime) -> UserInfo | None:
    """The user whose usable API key this is, or None; disabled users are returned with the
    flag set."""
    user = keys.key_owner(session, api_key, now)
    return None if user is None else user_info(user, budget_of(session, user))


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
    user = locked_user(session, name)
    user.disabled = disabled
    if disabled and now is not None:
        user.sessions_from = now
    return user_info(user, budget_of(session, user))


def rotate_api_key(session: Session, name: str, now: datetime) -> str:
    """Revoke every key of the user and issue one named `default`; the old keys and the
    dashboard sessions they bought stop working. Returns the new key, shown once."""
    user = locked_user(session, name)
    user.sessions_from = now
    keys.revoke_all(session, user, now=now)
    return keys.issue_key(session, user, keys.DEFAULT_KEY_NAME, expires_at=None, now=now).api_key


def check_limits(requests_per_minute: int | None, tokens_per_minute: int | None) -> None:
    """Refuse a rate limit that is not None or a positive integer within bounds."""
    for field, value, most in (
        ("requests_per_minute", requests_per_minute, MAX_REQUESTS_PER_MINUTE),
        ("tokens_per_minute", tokens_per_minute, MAX_TOKENS_PER_MINUTE),
    ):
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= most:
            raise InvalidInput(field, f"must be null (no limit) or an integer from 1 to {most}")


def set_limits(
    session: Session,
    name: str,
    *,
    requests_per_minute: int | _Unset | None,
    tokens_per_minute: int | _Unset | None,
) -> UserInfo:
    """Set the user's rate limits (None: no limit of its own; UNSET: unchanged)."""
    check_limits(
        None if isinstance(requests_per_minute, _Unset) else requests_per_minute,
        None if isinstance(tokens_per_minute, _Unset) else tokens_per_minute,
    )
    user = locked_user(session, name)
    if not isinstance(requests_per_minute, _Unset):
        user.requests_per_minute = requests_per_minute
    if not isinstance(tokens_per_minute, _Unset):
        user.tokens_per_minute = tokens_per_minute
    return user_info(user, budget_of(session, user))


def locked_user(session: Session, name: str) -> User:
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
    return user_info(locked_user(session, name), budget)
