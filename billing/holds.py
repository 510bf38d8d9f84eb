"""Holds: funds reserved for a request between admission and settlement, placed in groups.

`KnownHolds`: what one transaction knows of holds, as plain rows, each read at most once.

A group commit (`Ledger.commit_group`) places holds and then claims batches whose requests,
for a lone request, are the very holds it has just placed. Reading them back costs a
statement, and on PostgreSQL a round trip. `KnownHolds` keeps, for one transaction, what it
knows of each rid's hold: read from the database (all the group's rids in the group's first
round trip), placed by this transaction, or settled by it. That is exact because every hold's
state changes only under its user's lock, and the transaction holds the locks of every user
whose holds it reads or moves. A rid whose hold was placed again or after a period boundary
(`place_holds`, in a savepoint) is forgotten, and read again when next wanted.

A hold moves money from available to held (a `hold` entry: placed by `place_holds`, the
one path that places holds); settling its batch or releasing it moves it back (a `release`
entry, `release_entry`, the one rule for both). Both are keyed by the request id, so each
happens once. A hold belongs to the budget period it was placed in: released after that
period ended, its money expires with it (see `billing.grants`).

`place_holds`: the one path, for one request (`Ledger.place_hold`) or a group of many.

Each request is decided as if the requests had been placed one after the other in the group's
order, so a later request of a user sees the earlier ones' holds, and a refused request changes
nothing for the others. Every request is admitted by one rule (`_Group.refusal`: the user
enabled, the batch cap, the available funds) against the locked account
(`billing.postings.Account`: a plain row, the budget row read with the lock). The common case,
a new hold for an enabled user in a budget period already open, is decided in Python and
written with one multi-row insert for all holds and one for all their entries; each balance
row is updated once, all sent to the driver directly (`billing.driver_sql`). Two rarer cases
run inside a savepoint, so that a refusal undoes only their own writes (`_Group.place_slowly`):
a hold already placed for the rid (a replay, a re-opening or a conflict), and a user's first
hold after a budget period boundary (opening the period writes entries, which a refused hold
must not leave behind).

A replay with the same amount and payload fingerprint returns the hold as it is, except that a
released one is opened again (nothing was charged for it, so the retry is a fresh admission,
in the current period); another amount, user or fingerprint under the same rid is a conflict.

Every involved user is locked once, in name order (`postings.lock_rows`), so groups never
wait on each other in a cycle.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any, NamedTuple

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from inference_auctions.billing.driver_sql import Columns, Query, driver_cursor
from inference_auctions.billing.errors import (
    BatchCapExceeded,
    IdempotencyConflict,
    InsufficientFunds,
    InvalidInput,
    LedgerError,
    UnknownRequest,
    UnknownUser,
    UserDisabled,
)
from inference_auctions.billing.grants import expire_ended, open_period, period_at, period_end
from inference_auctions.billing.inputs import HoldInput
from inference_auctions.billing.models import HOLDS, REASON_LENGTH, EntryKind, Hold, HoldState, User
from inference_auctions.billing.money import check_micros
from inference_auctions.billing.postings import (
    Account,
    check_id,
    check_name,
    check_reason,
    insert_entries,
    lock_account,
    lock_rows,
    post,
    write_balances,
)
from inference_auctions.billing.views import HoldView

__all__ = ["HoldRow", "KnownHolds", "entry_key", "find_hold", "hold_view", "release_entry"]


class HoldRow(NamedTuple):
    """What placing and settling need to know of a hold."""

    rid: str
    user_id: int
    amount_micros: int
    state: HoldState
    period_start: datetime | None
    attempt: int
    fingerprint: str | None


_READ = Columns(HOLDS, HoldRow._fields)
_ROWS = f"SELECT {', '.join(HoldRow._fields)} FROM holds WHERE rid IN ({{in}})"


class KnownHolds:
    """The holds of one transaction's rids: None for a rid known to have no hold."""

    def __init__(self) -> None:
        self._rows: dict[str, HoldRow | None] = {}

    def query(self, rids: Iterable[str]) -> Query | None:
        """The read of those of `rids` not known yet (None if all are); its rows go to
        `learn`. Run it under the locks of the holds' users."""
        wanted = sorted({rid for rid in rids if rid not in self._rows})
        return Query(_ROWS, wanted, len(wanted)) if wanted else None

    def learn(self, query: Query, rows: Sequence[Sequence[object]], session: Session) -> None:
        """Take in the rows `query` read; its rids without a row have no hold."""
        convert = _READ.result(driver_cursor(session).dialect)
        for rid in query.params:
            self._rows[rid] = None
        for raw in rows:
            row = HoldRow._make(convert(raw))
            self._rows[row.rid] = row

    def rows(self, session: Session, rids: Iterable[str]) -> dict[str, HoldRow]:
        """The holds of `rids` that exist, reading the unknown ones (one statement)."""
        wanted = list(rids)
        query = self.query(wanted)
        if query is not None:
            found = driver_cursor(session).execute(query.sql, query.params, query.listed)
            self.learn(query, found, session)
        return {rid: row for rid in wanted if (row := self._rows[rid]) is not None}

    def placed(self, row: HoldRow) -> None:
        """This transaction wrote a new hold."""
        self._rows[row.rid] = row

    def settled(self, rids: Iterable[str]) -> None:
        """This transaction settled the open holds of `rids`."""
        for rid in rids:
            row = self._rows.get(rid)
            if row is not None:
                self._rows[rid] = row._replace(state=HoldState.SETTLED)

    def forget(self, rid: str) -> None:
        """Another path (the ORM's) may have written the hold of `rid`: read it again."""
        self._rows.pop(rid, None)


def hold_view(hold: Hold, user_name: str) -> HoldView:
    """The public view of a hold."""
    return HoldView(
        rid=hold.rid,
        user=user_name,
        amount_micros=hold.amount_micros,
        state=hold.state,
        created_at=hold.created_at,
        batch_id=hold.batch_id,
    )


def entry_key(kind: str, rid: str, attempt: int) -> str:
    """Idempotency key of a hold's `kind` entry in its `attempt`-th opening."""
    # The first opening keeps the historical keys; later ones count up.
    return f"{kind}:{rid}" if attempt == 1 else f"{kind}:{rid}#{attempt}"


def _entry_key(kind: str, hold: Hold) -> str:
    return entry_key(kind, hold.rid, hold.attempt)


def release_entry(
    account: Account,
    hold: Hold | HoldRow,
    *,
    reason: str,
    now: datetime,
    batch_id: str | None = None,
) -> dict[str, Any]:
    """Move the locked account by the release of an open hold (settled in `batch_id`, or
    dropped) and return the `release` entry as a row to insert."""
    return account.entry(
        EntryKind.RELEASE,
        -hold.amount_micros,
        key=entry_key("release", hold.rid, hold.attempt),
        now=now,
        reason=reason,
        batch_id=batch_id,
        request_id=hold.rid,
        period_start=hold.period_start,
    )


def close_hold(
    session: Session,
    account: Account,
    hold: Hold,
    state: HoldState,
    *,
    reason: str,
    now: datetime,
) -> None:
    """Release an open hold's funds unused; the caller holds the account lock. (Settling a
    batch closes its holds with one statement, `billing.settlement`.)"""
    hold.state = state
    hold.closed_at = now
    hold.batch_id = None
    insert_entries(session, [release_entry(account, hold, reason=reason, now=now)])
    write_balances(session, [account], now)


def drop_hold(
    session: Session, account: Account, hold: Hold, *, reason: str, now: datetime
) -> None:
    """Release an open hold unused; if its period has ended, the money expires with it."""
    budget = open_period(session, account, now)
    close_hold(session, account, hold, HoldState.RELEASED, reason=reason, now=now)
    expire_ended(
        session,
        account,
        budget,
        hold.period_start,
        hold.amount_micros,
        key=_entry_key("expire-hold", hold),
        reason=f"released after its period ended ({reason})"[:REASON_LENGTH],
        now=now,
    )


def find_hold(session: Session, rid: str) -> HoldView | None:
    """The hold placed for `rid`, if any."""
    row = session.execute(
        select(Hold, User.name)
        .join(User, User.id == Hold.user_id)
        .where(Hold.rid == check_id(rid, "rid"))
    ).first()
    return None if row is None else hold_view(row[0], row[1])


def release(session: Session, rid: str, reason: str, now: datetime) -> HoldView:
    """Release the hold of a request dropped before dispatch; a closed hold is left as it is."""
    check_reason(reason)
    found = find_hold(session, rid)
    if found is None:
        raise UnknownRequest(rid)
    account = lock_account(session, found.user)
    hold = session.get(Hold, rid, populate_existing=True)
    assert hold is not None
    if hold.state is HoldState.OPEN:
        drop_hold(session, account, hold, reason=reason, now=now)
        session.flush()
    return hold_view(hold, found.user)


def stale_holds(session: Session, cutoff: datetime) -> dict[str, list[str]]:
    """Open holds created before `cutoff`, grouped by user name (no lock)."""
    rows = session.execute(
        select(User.name, Hold.rid)
        .join(User, User.id == Hold.user_id)
        .where(Hold.state == HoldState.OPEN, Hold.created_at < cutoff)
        .order_by(User.name, Hold.rid)
    ).all()
    grouped: dict[str, list[str]] = defaultdict(list)
    for name, rid in rows:
        grouped[name].append(rid)
    return dict(grouped)


def expire_user_holds(
    session: Session, name: str, rids: list[str], max_age: timedelta, now: datetime
) -> int:
    """Release those of `rids` that are still open; returns how many were released."""
    account = lock_account(session, name)
    holds = session.scalars(
        select(Hold).where(Hold.rid.in_(rids)).execution_options(populate_existing=True)
    ).all()
    released = 0
    for hold in sorted(holds, key=lambda h: h.rid):
        # Re-checked under the lock: a settlement or another replica may have closed it.
        if hold.state is HoldState.OPEN and hold.created_at < now - max_age:
            reason = f"expired: not settled within {max_age.total_seconds():g} s"
            drop_hold(session, account, hold, reason=reason, now=now)
            released += 1
    return released


# The column holds a SHA-256 in hex.
FINGERPRINT_LENGTH = 64

HoldResult = HoldView | LedgerError

# The columns a hold row of `_Group.place_new` fills; both statements go to the driver
# directly (`billing.driver_sql`).
_HOLD_COLUMNS = Columns(
    HOLDS,
    (
        "rid",
        "user_id",
        "amount_micros",
        "state",
        "batch_id",
        "created_at",
        "closed_at",
        "period_start",
        "fingerprint",
        "attempt",
    ),
)


def check_request(request: HoldInput) -> None:
    """Validate a request's fields, in the order they have always been checked."""
    check_id(request.rid, "rid")
    check_micros(request.amount_micros, "amount_micros")
    check_name(request.user, "name")
    fingerprint = request.fingerprint
    if fingerprint is not None and (
        not isinstance(fingerprint, str) or len(fingerprint) > FINGERPRINT_LENGTH
    ):
        raise InvalidInput(
            "fingerprint", f"must be a string of at most {FINGERPRINT_LENGTH} characters"
        )


def place_holds(
    session: Session,
    requests: Sequence[HoldInput],
    now: datetime,
    locked: dict[str, Account] | None = None,
    known: KnownHolds | None = None,
) -> list[HoldResult]:
    """Place `requests` in order; each result is the hold's view or the error refusing it.

    `locked`: the accounts this transaction has already locked (`postings.lock_rows`),
    at least the requests' users that exist; they are moved in place, so the caller's rows
    stay the truth. Without it, the requests' users are locked here. `known`: what this
    transaction knows of holds already (`KnownHolds`), kept up to date."""
    results: list[HoldResult | None] = [None] * len(requests)
    valid: list[int] = []
    for index, request in enumerate(requests):
        try:
            check_request(request)
        except LedgerError as error:
            results[index] = error
        else:
            valid.append(index)
    group = _Group(session, {requests[i].user for i in valid}, now, locked, known)
    existing = group.existing_rids([requests[i].rid for i in valid])
    for index in valid:
        request = requests[index]
        account = group.accounts.get(request.user)
        if account is None:
            results[index] = UnknownUser(request.user)
        elif request.rid in existing or request.rid in group.placed or group.period_due(account):
            results[index] = group.place_slowly(request, account)
        else:
            results[index] = group.place_new(request, account)
    group.write()
    return [result for result in results if result is not None]


class _Group:
    """The locked accounts of one group and the holds decided but not yet written."""

    def __init__(
        self,
        session: Session,
        names: set[str],
        now: datetime,
        locked: dict[str, Account] | None = None,
        known: KnownHolds | None = None,
    ) -> None:
        self.session = session
        self.now = now
        self.accounts = lock_rows(session, names) if locked is None else locked
        self.known = KnownHolds() if known is None else known
        self.placed: set[str] = set()
        self._holds: list[dict[str, Any]] = []
        self._entries: list[dict[str, Any]] = []
        # Per user, valid until a hold of the user goes through `place_slowly`: whether the
        # budget period is known to be open, and what the user's open holds sum to (the cap).
        self._period_open: set[str] = set()
        self._open_totals: dict[str, int] = {}

    def existing_rids(self, rids: list[str]) -> set[str]:
        """Those of `rids` that already have a hold (read under the users' locks, unless
        this transaction read them already)."""
        return set(self.known.rows(self.session, rids))

    def refusal(self, account: Account, amount: int) -> LedgerError | None:
        """Why a hold of `amount` may not be placed for the account now, if it may not: the
        one admission rule of every hold."""
        name = account.name
        if account.disabled:
            return UserDisabled(name)
        # Every batch draws its requests from the open holds, so capping what is open at once
        # caps what any single batch can charge.
        cap = account.budget.batch_cap_micros
        if cap is not None:
            held = self._open_total(account)
            if held + amount > cap:
                return BatchCapExceeded(name, cap, held, amount)
        if account.available < amount:
            renews_at = period_end(account.budget, self.now)
            return InsufficientFunds(name, account.available, amount, renews_at)
        return None

    def place_new(self, request: HoldInput, account: Account) -> HoldResult:
        """Decide a hold for a rid that has none, in the account's open period."""
        refused = self.refusal(account, request.amount_micros)
        if refused is not None:
            return refused
        return self._add_new(request, account)

    def _add_new(self, request: HoldInput, account: Account) -> HoldView:
        name = request.user
        amount = request.amount_micros
        period = account.budget.current_period_start
        self.known.placed(
            HoldRow(
                rid=request.rid,
                user_id=account.user_id,
                amount_micros=amount,
                state=HoldState.OPEN,
                period_start=period,
                attempt=1,
                fingerprint=request.fingerprint,
            )
        )
        self._holds.append(
            {
                "rid": request.rid,
                "user_id": account.user_id,
                "amount_micros": amount,
                "state": HoldState.OPEN,
                "batch_id": None,
                "created_at": self.now,
                "closed_at": None,
                "period_start": period,
                "fingerprint": request.fingerprint,
                "attempt": 1,
            }
        )
        self._entries.append(
            account.entry(
                EntryKind.HOLD,
                amount,
                key=f"hold:{request.rid}",
                now=self.now,
                request_id=request.rid,
                period_start=period,
            )
        )
        if name in self._open_totals:
            self._open_totals[name] += amount
        self.placed.add(request.rid)
        return HoldView(
            rid=request.rid,
            user=name,
            amount_micros=amount,
            state=HoldState.OPEN,
            created_at=self.now,
            batch_id=None,
        )

    def place_slowly(self, request: HoldInput, account: Account) -> HoldResult:
        """Place a hold whose rid has one already, or whose user's budget period must be
        opened first, in a savepoint: a refusal undoes its writes and leaves the account as
        it found it."""
        self.write()  # it must see every hold decided before it
        # Whatever it decides, a later request for this rid must find what it wrote.
        self.placed.add(request.rid)
        self.known.forget(request.rid)
        self._period_open.discard(request.user)
        self._open_totals.pop(request.user, None)
        before = replace(account)
        try:
            with self.session.begin_nested():
                return self._place_slowly(request, account)
        except LedgerError as error:
            for field in ("disabled", "balance_micros", "held_micros", "budget", "changed"):
                setattr(account, field, getattr(before, field))
            self._open_totals.pop(request.user, None)
            return error

    def _place_slowly(self, request: HoldInput, account: Account) -> HoldView:
        """`place_slowly` in its savepoint; raises the refusal, which undoes the savepoint."""
        name, rid, amount = request.user, request.rid, request.amount_micros
        existing = self.session.get(Hold, rid, populate_existing=True)
        if existing is not None:
            if (existing.user_id, existing.amount_micros) != (account.user_id, amount):
                raise IdempotencyConflict(
                    f"hold:{rid}",
                    f"a hold of {existing.amount_micros} micro-credits was placed for this"
                    f" request, now {amount} for user {name!r}",
                )
            fingerprint = request.fingerprint
            if fingerprint is not None and existing.fingerprint not in (None, fingerprint):
                raise IdempotencyConflict(
                    f"hold:{rid}", "the request was held with another payload"
                )
            if existing.state is not HoldState.RELEASED:
                return hold_view(existing, name)
        if account.disabled:
            raise UserDisabled(name)
        # The boundary may have passed since the last operation: yesterday's leftovers must
        # not be spendable after midnight, whether or not the rollover job ran.
        open_period(self.session, account, self.now)
        refused = self.refusal(account, amount)
        if refused is not None:
            raise refused
        if existing is None:
            return self._add_new(request, account)
        # A released hold is placed anew: in the current period, against what is available.
        period = account.budget.current_period_start
        existing.attempt += 1
        existing.state = HoldState.OPEN
        existing.created_at = self.now
        existing.closed_at = None
        existing.batch_id = None
        existing.period_start = period
        post(
            self.session,
            account,
            EntryKind.HOLD,
            amount,
            key=entry_key("hold", rid, existing.attempt),
            now=self.now,
            request_id=rid,
            period_start=period,
        )
        self.session.flush()
        self._open_totals.pop(name, None)
        return hold_view(existing, name)

    def write(self) -> None:
        """Write the holds decided so far, their entries and the balances, one statement each,
        sent together (one round trip to a database server)."""
        with driver_cursor(self.session).together():
            if self._holds:
                driver_cursor(self.session).insert(_HOLD_COLUMNS, self._holds)
                insert_entries(self.session, self._entries)
                self._holds = []
                self._entries = []
            write_balances(self.session, list(self.accounts.values()), self.now)

    def period_due(self, account: Account) -> bool:
        """Whether the user's budget period must be opened first (then cached as open)."""
        name = account.name
        if name in self._period_open:
            return False
        # The boundary may have passed since the last operation: yesterday's leftovers must
        # not be spendable after midnight, whether or not the rollover job ran.
        budget = account.budget
        if period_at(budget, self.now) > budget.current_period_start:
            return True
        self._period_open.add(name)
        return False

    def _open_total(self, account: Account) -> int:
        name = account.name
        total = self._open_totals.get(name)
        if total is None:
            total = self._open_totals[name] = int(
                self.session.scalar(
                    select(func.coalesce(func.sum(Hold.amount_micros), 0)).where(
                        Hold.user_id == account.user_id, Hold.state == HoldState.OPEN
                    )
                )
                or 0
            )
        return total
