"""Group commit of holds: many requests' holds placed in one transaction.

Each request is decided as `holds.place_hold` would decide it had the requests been placed one
after the other in the group's order, so a later request of a user sees the earlier ones'
holds, and a refused request changes nothing for the others. The common case, a new hold for
an enabled user, is decided in Python against the locked balance row and written with one
multi-row insert for all holds and one for all their entries; each balance row is updated
once (`billing.account_rows`: plain rows, the budget row read with the lock), all sent to
the driver directly (`billing.driver_sql`). Every other case goes through
`holds.place_hold` itself, inside a savepoint so that its refusal undoes only its own
writes: a hold already placed for the rid (a replay, a re-opening or a conflict), and a
user's first hold after a budget period boundary (opening the period writes entries, which a
refused hold must not leave behind).

Every involved user is locked once, in name order (`account_rows.lock_rows`), so groups never
wait on each other in a cycle.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from inference_auctions.billing import holds
from inference_auctions.billing.account_rows import AccountRow, lock_rows, write_balances
from inference_auctions.billing.driver_sql import Columns, driver_cursor
from inference_auctions.billing.errors import (
    BatchCapExceeded,
    InsufficientFunds,
    InvalidInput,
    LedgerError,
    UnknownUser,
    UserDisabled,
)
from inference_auctions.billing.grants import period_at
from inference_auctions.billing.hold_rows import HoldRow, KnownHolds
from inference_auctions.billing.models import HOLDS, EntryKind, Hold, HoldState
from inference_auctions.billing.money import check_micros
from inference_auctions.billing.postings import check_id, check_name, insert_entries
from inference_auctions.billing.records import HoldRequest, HoldView

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


def check_request(request: HoldRequest) -> None:
    """Validate a request's fields, in the order `place_hold` always checked them."""
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
    requests: Sequence[HoldRequest],
    now: datetime,
    locked: dict[str, AccountRow] | None = None,
    known: KnownHolds | None = None,
) -> list[HoldResult]:
    """Place `requests` in order; each result is the hold's view or the error refusing it.

    `locked`: the accounts this transaction has already locked (`account_rows.lock_rows`),
    at least the requests' users that exist; they are moved in place, so the caller's rows
    stay the truth. Without it, the requests' users are locked here. `known`: what this
    transaction knows of holds already (`billing.hold_rows`), kept up to date."""
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
            results[index] = group.place_slowly(request)
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
        locked: dict[str, AccountRow] | None = None,
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

    def place_new(self, request: HoldRequest, account: AccountRow) -> HoldResult:
        """Decide a hold for a rid that has none, as `holds.place_hold` does."""
        name = request.user
        if account.disabled:
            return UserDisabled(name)
        budget = account.budget
        amount = request.amount_micros
        cap = budget.batch_cap_micros
        if cap is not None:
            held = self._open_total(account)
            if held + amount > cap:
                return BatchCapExceeded(name, cap, held, amount)
        if account.available < amount:
            return InsufficientFunds(name, account.available, amount)
        period = budget.current_period_start
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
        if cap is not None:
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

    def place_slowly(self, request: HoldRequest) -> HoldResult:
        """Place a hold through `holds.place_hold`, undoing only its own writes if refused."""
        self.write()  # it must see every hold decided before it
        # The ORM reads the rows afresh: instances loaded by an earlier slow request are
        # stale once `write` has moved their balances.
        self.session.expire_all()
        # Whatever it decides, a later request for this rid must find what it wrote.
        self.placed.add(request.rid)
        self.known.forget(request.rid)
        self._period_open.discard(request.user)
        self._open_totals.pop(request.user, None)
        result: HoldResult
        try:
            with self.session.begin_nested():
                result = holds.place_hold(
                    self.session,
                    request.user,
                    request.rid,
                    request.amount_micros,
                    self.now,
                    request.fingerprint,
                )
        except LedgerError as error:
            result = error
        # Read back what it left: the balance, and the budget if it opened a period.
        self.accounts.update(lock_rows(self.session, [request.user]))
        return result

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

    def period_due(self, account: AccountRow) -> bool:
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

    def _open_total(self, account: AccountRow) -> int:
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
