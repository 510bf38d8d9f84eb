"""What the ledger answers: plain frozen views of its rows, named `*View` (or for what they are:
a result, a page, a batch settled).

Callers never see ORM objects, so nothing they hold can lazily reach back into a session. What
callers hand the ledger are `*Input`s (`billing.inputs`); what the API, the CLI and the exports
show of a view is its `*Record` (`billing.schemas`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from inference_auctions.billing.models import BatchRequest, EntryKind, HoldState, RequestStatus
from inference_auctions.billing.periods import Period


@dataclass(frozen=True, slots=True)
class PricedRequestView:
    """What crash recovery knows of a settled request to price its batch again."""

    rid: str
    user: str
    bid_micros: int
    arrival: int | None
    tree_path: list[int] | None
    # Its batch's priority slots (None: as many as the batch's requests, the paper's rule).
    priority_slots: int | None = None
    # Its batch's pricing rule (`batch-size`, `fixed-slots`, `rolling-slots`, or a fixed-price
    # mode's name:
    # `tiers`, `fcfs`, where `bid_micros` is the price the request was admitted at).
    pricing_rule: str = "batch-size"
    # Its place in its batch (0 is served first): a rolling batch's shares read it.
    position: int | None = None

    @classmethod
    def of(
        cls,
        request: BatchRequest,
        owner: str,
        slots: int | None = None,
        rule: str = "batch-size",
    ) -> PricedRequestView:
        """The settled request `request` of user `owner`, in a batch of `slots` slots cleared
        under `rule`."""
        return cls(
            rid=request.rid,
            user=owner,
            bid_micros=request.bid_micros,
            arrival=request.arrival,
            tree_path=request.tree_nodes,
            priority_slots=slots,
            pricing_rule=rule,
            position=request.position,
        )


# (the batch's requests, a user, the user's failed rids, the user's charge) -> the refund.
RefundRule = Callable[[Sequence[PricedRequestView], str, frozenset[str], int], int]


@dataclass(frozen=True, slots=True)
class ClaimedBatch:
    """A batch settled for the requests whose holds could be claimed, and why the rest could not.

    `settled` is None when no hold could be claimed; `refused` maps rid -> the hold's state
    (`settled`, `released`), `unknown` (no hold, or another user's), or `conflict` (held for
    another payload under the same rid).
    """

    settled: SettleResult | None
    refused: Mapping[str, str]


@dataclass(frozen=True, slots=True)
class UserInfo:
    """A user and the budget the user is granted."""

    name: str
    is_admin: bool
    disabled: bool
    created_at: datetime
    budget_micros: int
    period: Period
    timezone: str
    batch_cap_micros: int | None
    # A budget change that waits for the next period boundary, `pending_from`.
    pending_budget_micros: int | None = None
    pending_period: Period | None = None
    pending_timezone: str | None = None
    pending_from: datetime | None = None
    # Dashboard sessions signed in before this moment are over (key rotated, user disabled).
    sessions_from: datetime | None = None
    # The user's own rate limits (None: only the server-wide one).
    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None


@dataclass(frozen=True, slots=True)
class CreatedUser:
    """A new user; `api_key` is returned this once and stored only as a hash."""

    user: UserInfo
    api_key: str = field(repr=False)


@dataclass(frozen=True, slots=True)
class HoldView:
    """A hold placed for one request."""

    rid: str
    user: str
    amount_micros: int
    state: HoldState
    created_at: datetime
    batch_id: str | None


@dataclass(frozen=True, slots=True)
class SettleResult:
    """What settling a batch moved: each user's charge, fees and the holds released
    (micro-credits).

    `replayed` tells a replay from the first settlement; it does not take part in equality, so
    a replay returns a result equal to the first one.
    """

    batch_id: str
    charges_micros: Mapping[str, int]
    released_micros: Mapping[str, int]
    replayed: bool = field(default=False, compare=False)
    # Each user's request fees in the batch (docs/SPEC.md section 5); empty without a fee.
    fees_micros: Mapping[str, int] = field(default_factory=dict)
    # Each user's part of the posted price floor (docs/SPEC.md section 7); empty without one.
    floors_micros: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class RefundResult:
    """A refund of (part of) a user's charge in a batch."""

    batch_id: str
    user: str
    amount_micros: int
    charged_micros: int
    refunded_total_micros: int
    # The request fee given back with it (docs/SPEC.md section 5: a failed request's fee).
    fee_micros: int = 0
    # The price floor it paid, given back with it (docs/SPEC.md section 7).
    floor_micros: int = 0


@dataclass(frozen=True, slots=True)
class RequestView:
    """A settled request as stored, with its serving status."""

    rid: str
    batch_id: str
    user: str
    position: int
    priority: float
    bid_micros: int
    prompt_tokens: int
    cached_tokens: int | None
    ttft_ms: float | None
    status: RequestStatus


@dataclass(frozen=True, slots=True)
class BalanceView:
    """A user's money now: `available = balance - held`, never below 0."""

    user: str
    balance_micros: int
    held_micros: int
    available_micros: int
    spent_this_period_micros: int
    period: Period
    period_start: datetime
    # The next boundary (a calendar one, or a budget change waiting for it); None: lifetime.
    period_end: datetime | None = None


@dataclass(frozen=True, slots=True)
class EntryView:
    """One ledger entry; `amount_micros` is signed as its kind dictates."""

    id: int
    user: str
    kind: EntryKind
    amount_micros: int
    batch_id: str | None
    request_id: str | None
    reason: str | None
    idempotency_key: str
    created_at: datetime
    # The budget period the money belongs to; None on entries from before it was recorded.
    period_start: datetime | None = None


@dataclass(frozen=True, slots=True)
class EntryPage:
    """A page of entries, oldest first; pass `next_cursor` back for the next page."""

    entries: list[EntryView]
    next_cursor: str | None


@dataclass(frozen=True, slots=True)
class SummaryView:
    """Totals of one day, week or month (in the user's budget time zone); all micro-credits."""

    period_start: datetime
    granted_micros: int
    charged_micros: int
    refunded_micros: int
    adjusted_micros: int
    net_micros: int
    entries: int
    fees_micros: int = 0  # request fees paid, net of those given back
    floors_micros: int = 0  # price floors paid, net of those given back


@dataclass(frozen=True, slots=True)
class DriftView:
    """A balance row that disagrees with the sum of its user's entries."""

    user: str
    balance_micros: int | None  # None when the balance row is missing
    expected_balance_micros: int
    held_micros: int | None
    expected_held_micros: int
    open_holds_micros: int


@dataclass(frozen=True, slots=True)
class ReconcileView:
    """Result of checking every balance row against the entries."""

    accounts_checked: int
    drifts: list[DriftView]

    @property
    def ok(self) -> bool:
        """True when no account drifted."""
        return not self.drifts


@dataclass(frozen=True, slots=True)
class RolloverResult:
    """Users granted a new period by one rollover run."""

    granted: list[str]
