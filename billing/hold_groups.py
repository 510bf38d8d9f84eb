"""Group commit of holds: many requests' holds placed in one transaction.

Each request is decided as `holds.place_hold` would decide it had the requests been placed one
after the other in the group's order, so a later request of a user sees the earlier ones'
holds, and a refused request changes nothing for the others. The common case, a new hold for
an enabled user, is decided in Python against the locked balance row and written with one
multi-row insert for all holds and one for all their entries; each balance row is updated
once. Every other case goes through `holds.place_hold` itself, inside a savepoint so that its
refusal undoes only its own writes: a hold already placed for the rid (a replay, a re-opening
or a conflict), and a user's first hold after a budget period boundary (opening the period
writes entries, which a refused hold must not leave behind).

Every involved user is locked once, in name order (`lock_existing_accounts`), so groups never
wait on each other in a cycle.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import func, insert, select
from sqlalchemy.orm import Session

from inference_auctions.billing import holds
from inference_auctions.billing.errors import (
    BatchCapExceeded,
    InsufficientFunds,
    InvalidInput,
    LedgerError,
    UnknownUser,
    UserDisabled,
)
from inference_auctions.billing.grants import budget_row, period_at
from inference_auctions.billing.models import HOLDS, Budget, EntryKind, Hold, HoldState
from inference_auctions.billing.money import check_micros
from inference_auctions.billing.postings import (
    Account,
    check_id,
    check_name,
    entry_row,
    insert_entries,
    lock_existing_accounts,
)
from inference_auctions.billing.records import HoldRequest, HoldView

# The column holds a SHA-256 in hex.
FINGERPRINT_LENGTH = 64

HoldResult = HoldView | LedgerError


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
    session: Session, requests: Sequence[HoldRequest], now: datetime
) -> list[HoldResult]:
    """Place `requests` in order; each result is the hold's view or the error refusing it."""
    results: list[HoldResult | None] = [None] * len(requests)
    valid: list[int] = []
    for index, request in enumerate(requests):
        try:
            check_request(request)
        except LedgerError as error:
            results[index] = error
        else:
            valid.append(index)
    group = _Group(session, {requests[i].user for i in valid}, now)
    known = group.existing_rids([requests[i].rid for i in valid])
    for index in valid:
        request = requests[index]
        account = group.accounts.get(request.user)
        if account is None:
            results[index] = UnknownUser(request.user)
        elif request.rid in known or request.rid in group.placed or group.period_due(account):
            results[index] = group.place_slowly(request)
        else:
            results[index] = group.place_new(request, account)
    group.write()
    return [result for result in results if result is not None]


class _Group:
    """The locked accounts of one group and the holds decided but not yet written."""

    def __init__(self, session: Session, names: set[str], now: datetime) -> None:
        self.session = session
        self.now = now
        self.accounts = lock_existing_accounts(session, names)
        self.placed: set[str] = set()
        self._holds: list[dict[str, Any]] = []
        self._entries: list[dict[str, Any]] = []
        # Per user, valid until a hold of the user goes through `place_slowly`: the budget
        # row with its period opened, and what the user's open holds sum to (for the cap).
        self._budgets: dict[str, Budget] = {}
        self._open_totals: dict[str, int] = {}

    def existing_rids(self, rids: list[str]) -> set[str]:
        """Those of `rids` that already have a hold (read under the users' locks)."""
        if not rids:
            return set()
        return set(self.session.scalars(select(Hold.rid).where(Hold.rid.in_(set(rids)))))

    def place_new(self, request: HoldRequest, account: Account) -> HoldResult:
        """Decide a hold for a rid that has none, as `holds.place_hold` does."""
        name = request.user
        if account.user.disabled:
            return UserDisabled(name)
        budget = self._budgets[name]
        amount = request.amount_micros
        cap = budget.batch_cap_micros
        if cap is not None:
            held = self._open_total(account)
            if held + amount > cap:
                return BatchCapExceeded(name, cap, held, amount)
        if account.available < amount:
            return InsufficientFunds(name, account.available, amount)
        period = budget.current_period_start
        self._holds.append(
            {
                "rid": request.rid,
                "user_id": account.user.id,
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
            entry_row(
                account,
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
        # Whatever it decides, a later request for this rid must find what it wrote.
        self.placed.add(request.rid)
        self._budgets.pop(request.user, None)
        self._open_totals.pop(request.user, None)
        try:
            with self.session.begin_nested():
                return holds.place_hold(
                    self.session,
                    request.user,
                    request.rid,
                    request.amount_micros,
                    self.now,
                    request.fingerprint,
                )
        except LedgerError as error:
            return error

    def write(self) -> None:
        """Insert the holds decided so far and their entries, one statement each."""
        if self._holds:
            self.session.connection().execute(insert(HOLDS), self._holds)
            insert_entries(self.session, self._entries)
            self._holds = []
            self._entries = []

    def period_due(self, account: Account) -> bool:
        """Whether the user's budget period must be opened first (then cached as open)."""
        name = account.user.name
        if name in self._budgets:
            return False
        # The boundary may have passed since the last operation: yesterday's leftovers must
        # not be spendable after midnight, whether or not the rollover job ran.
        budget = budget_row(self.session, account.user.id)
        if period_at(budget, self.now) > budget.current_period_start:
            return True
        self._budgets[name] = budget
        return False

    def _open_total(self, account: Account) -> int:
        name = account.user.name
        total = self._open_totals.get(name)
        if total is None:
            total = self._open_totals[name] = int(
                self.session.scalar(
                    select(func.coalesce(func.sum(Hold.amount_micros), 0)).where(
                        Hold.user_id == account.user.id, Hold.state == HoldState.OPEN
                    )
                )
                or 0
            )
        return total
