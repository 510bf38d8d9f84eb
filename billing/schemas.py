"""The `*Record`s: one schema per ledger view, shared by the HTTP API, the CLI and the exports.

Each record names its fields once, in one order: the API's JSON keys, the CLI's JSON keys and
the CSV columns of `ledger entries` and `ledger export` are the same list. Money is integer
`*_micros`; times are ISO 8601 with their UTC offset. An entry's request is `rid`, as the
client sent it (the ledger keys requests `user/rid` internally).
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Self

from pydantic import BaseModel, ConfigDict, PlainSerializer

from inference_auctions.billing.views import (
    BalanceView,
    DriftView,
    EntryView,
    ReconcileView,
    SummaryView,
)

# isoformat(), as the API has always written times ("+00:00", not pydantic's "Z").
Moment = Annotated[datetime, PlainSerializer(datetime.isoformat, return_type=str)]


class LedgerRecord(BaseModel):
    """A record as every interface shows it; `columns()` is its one field order."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    @classmethod
    def columns(cls) -> list[str]:
        """The field names in order: JSON keys and CSV columns alike."""
        return list(cls.model_fields)

    def as_json(self) -> dict[str, Any]:
        """The record as JSON-ready values."""
        return self.model_dump(mode="json")


def public_rid(user: str, ledger_rid: str | None) -> str | None:
    """The rid as the client sent it: the ledger keys holds by `user/rid` internally."""
    if ledger_rid is None:
        return None
    return ledger_rid.removeprefix(f"{user}/")


class EntryRecord(LedgerRecord):
    """One ledger entry; `amount_micros` is signed as its kind dictates."""

    id: int
    created_at: Moment
    user: str
    kind: str
    amount_micros: int
    batch_id: str | None
    rid: str | None
    reason: str | None
    idempotency_key: str
    period_start: Moment | None

    @classmethod
    def of(cls, entry: EntryView) -> Self:
        """The record of an entry."""
        return cls(
            id=entry.id,
            created_at=entry.created_at,
            user=entry.user,
            kind=entry.kind.value,
            amount_micros=entry.amount_micros,
            batch_id=entry.batch_id,
            rid=public_rid(entry.user, entry.request_id),
            reason=entry.reason,
            idempotency_key=entry.idempotency_key,
            period_start=entry.period_start,
        )


class BalanceRecord(LedgerRecord):
    """A user's money now; `period_end` is None for a lifetime budget."""

    user: str
    balance_micros: int
    held_micros: int
    available_micros: int
    spent_this_period_micros: int
    period: str
    period_start: Moment
    period_end: Moment | None

    @classmethod
    def of(cls, view: BalanceView) -> Self:
        """The record of a balance."""
        return cls(
            user=view.user,
            balance_micros=view.balance_micros,
            held_micros=view.held_micros,
            available_micros=view.available_micros,
            spent_this_period_micros=view.spent_this_period_micros,
            period=view.period.value,
            period_start=view.period_start,
            period_end=view.period_end,
        )


class SummaryRecord(LedgerRecord):
    """Totals of one day, week or month of a user's entries."""

    period_start: Moment
    granted_micros: int
    charged_micros: int
    refunded_micros: int
    adjusted_micros: int
    fees_micros: int
    floors_micros: int
    net_micros: int
    entries: int

    @classmethod
    def of(cls, row: SummaryView) -> Self:
        """The record of a summary row."""
        return cls(
            period_start=row.period_start,
            granted_micros=row.granted_micros,
            charged_micros=row.charged_micros,
            refunded_micros=row.refunded_micros,
            adjusted_micros=row.adjusted_micros,
            fees_micros=row.fees_micros,
            floors_micros=row.floors_micros,
            net_micros=row.net_micros,
            entries=row.entries,
        )


class DriftRecord(LedgerRecord):
    """A balance row that disagrees with the sum of its user's entries."""

    user: str
    balance_micros: int | None
    expected_balance_micros: int
    held_micros: int | None
    expected_held_micros: int
    open_holds_micros: int

    @classmethod
    def of(cls, drift: DriftView) -> Self:
        """The record of a drifted account."""
        return cls(
            user=drift.user,
            balance_micros=drift.balance_micros,
            expected_balance_micros=drift.expected_balance_micros,
            held_micros=drift.held_micros,
            expected_held_micros=drift.expected_held_micros,
            open_holds_micros=drift.open_holds_micros,
        )


class ReconcileRecord(LedgerRecord):
    """The result of checking every balance row against the entries."""

    ok: bool
    accounts_checked: int
    drifts: list[DriftRecord]

    @classmethod
    def of(cls, report: ReconcileView) -> Self:
        """The record of a reconciliation."""
        return cls(
            ok=report.ok,
            accounts_checked=report.accounts_checked,
            drifts=[DriftRecord.of(d) for d in report.drifts],
        )
