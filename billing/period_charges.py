"""Charges and refunds across period boundaries: each counts in the period its money came from.

A user's charge in a batch is counted in the periods its holds were placed in: against the
older period's holds first, up to what they held, then the newer ones'. What an ended
period's holds held beyond their charge expires with that period. A refund is credited to the
periods of the charge it refunds (the newest first, never more than a period was charged); the
part credited to an ended period expires with it. A charge or refund that spans two periods
is one entry per period: the first under the caller's key, the others under `key@period`.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from inference_auctions.billing.grants import expire_ended
from inference_auctions.billing.models import Budget, EntryKind, LedgerEntry
from inference_auctions.billing.postings import Account, post, time_key


def _period(budget: Budget, start: datetime | None) -> datetime:
    # Holds and entries from before periods were recorded count in the current period.
    return budget.current_period_start if start is None else start


def _part_key(key: str, first: bool, start: datetime) -> str:
    return key if first else f"{key}@{time_key(start)}"


@dataclass(slots=True)
class _Taking:
    """One kind of money a settlement takes from a user's holds (the charge, the request fees,
    the price floor), period by period: one entry per period it is taken from, the first under
    `key`, the others under `key@period`."""

    kind: EntryKind
    left: int
    key: str
    reason: str
    first: bool = True

    def part(self, room: int) -> int:
        """Take what is left of it, up to `room` of a period's holds; returns what was taken."""
        part = min(self.left, room)
        self.left -= part
        return part

    def entry(
        self, account: Account, part: int, start: datetime, *, batch_id: str, now: datetime
    ) -> dict[str, Any]:
        """The entry of `part` taken from the holds of the period starting at `start`."""
        entry = account.entry(
            self.kind,
            -part,
            key=_part_key(self.key, self.first, start),
            now=now,
            reason=self.reason,
            batch_id=batch_id,
            period_start=start,
        )
        self.first = False
        return entry


def charge_entries(
    account: Account,
    *,
    held: Iterable[tuple[datetime | None, int]],
    charge_micros: int,
    key: str,
    batch_id: str,
    now: datetime,
    fee_micros: int = 0,
    fee_key: str = "",
    floor_micros: int = 0,
    floor_key: str = "",
) -> list[dict[str, Any]]:
    """Charge `charge_micros`, the request fees `fee_micros` (under `fee_key`) and the price
    floor `floor_micros` (under `floor_key`) against the user's holds `held` (period, amount)
    in a batch.

    Moves the locked row and returns the entries to insert: the charge, the fee and the floor,
    one per period each spans, and the expiry of what an ended period's holds held beyond them.
    """
    current = account.budget.current_period_start
    by_period: dict[datetime, int] = defaultdict(int)
    for start, amount in held:
        by_period[current if start is None else start] += amount
    charge = _Taking(EntryKind.CHARGE, charge_micros, key, f"VCG payment in batch {batch_id}")
    fee = _Taking(EntryKind.FEE, fee_micros, fee_key, f"request fees in batch {batch_id}")
    floor = _Taking(EntryKind.FLOOR, floor_micros, floor_key, f"price floor in batch {batch_id}")
    entries: list[dict[str, Any]] = []
    for start in sorted(by_period):
        # Each period's holds pay the charge first, then the fees, then the floor...
        charge_part = charge.part(by_period[start])
        fee_part = fee.part(by_period[start] - charge_part)
        floor_part = floor.part(by_period[start] - charge_part - fee_part)
        # ...and the entries keep the order they have always been written in (fee, charge,
        # floor), so that a ledger's entry ids read the same whichever version settled it.
        for taking, part in ((fee, fee_part), (charge, charge_part), (floor, floor_part)):
            if part:
                entries.append(taking.entry(account, part, start, batch_id=batch_id, now=now))
        unused = by_period[start] - charge_part - fee_part - floor_part
        # As `grants.expire_ended`: money returned to an ended period expires with it.
        if unused > 0 and start < current:
            entries.append(
                account.entry(
                    EntryKind.ADJUSTMENT,
                    -unused,
                    key=f"expire-unused:{account.user_id}:{batch_id}@{time_key(start)}",
                    now=now,
                    reason=(
                        f"unused part of holds settled in batch {batch_id} after their period ended"
                    ),
                    period_start=start,
                )
            )
    assert charge.left == fee.left == floor.left == 0, "the caller checks that the holds cover them"
    return entries


def _by_period(
    session: Session, budget: Budget, kind: EntryKind, batch_id: str, sign: int = 0
) -> dict[datetime, int]:
    # `sign`: only the entries taken (< 0) or given back (> 0), for a kind that does both (fee).
    column = LedgerEntry.amount_micros
    signed = [column < 0] if sign < 0 else [column > 0] if sign > 0 else []
    rows = session.execute(
        select(LedgerEntry.period_start, func.sum(column))
        .where(
            LedgerEntry.user_id == budget.user_id,
            LedgerEntry.batch_id == batch_id,
            LedgerEntry.kind == kind,
            *signed,
        )
        .group_by(LedgerEntry.period_start)
    ).all()
    totals: dict[datetime, int] = defaultdict(int)
    for start, amount in rows:
        totals[_period(budget, start)] += abs(int(amount))
    return totals


def charged(session: Session, budget: Budget, batch_id: str) -> int:
    """What the user was charged in the batch, over all periods."""
    return sum(_by_period(session, budget, EntryKind.CHARGE, batch_id).values())


def taken_and_given_back(
    session: Session, budget: Budget, kind: EntryKind, batch_id: str
) -> tuple[int, int]:
    """What the user paid in the batch under `kind` (the request fees, the price floor), and
    how much of it came back."""
    taken = _by_period(session, budget, kind, batch_id, sign=-1)
    back = _by_period(session, budget, kind, batch_id, sign=1)
    return sum(taken.values()), sum(back.values())


def recorded_refund(session: Session, user_id: int, batch_id: str, rid: str | None) -> int | None:
    """What the refund of `rid` (None: the batch-level one) credited in all periods, or None."""
    # Matched by user, batch and request rather than by key prefix: a client's rid may itself
    # contain "@".
    total = session.scalar(
        select(func.sum(LedgerEntry.amount_micros)).where(
            LedgerEntry.kind == EntryKind.REFUND,
            LedgerEntry.user_id == user_id,
            LedgerEntry.batch_id == batch_id,
            LedgerEntry.request_id.is_(None) if rid is None else LedgerEntry.request_id == rid,
        )
    )
    return None if total is None else int(total)


def post_refund(
    session: Session,
    account: Account,
    budget: Budget,
    *,
    amount_micros: int,
    key: str,
    reason: str,
    batch_id: str,
    rid: str | None,
    now: datetime,
    kind: EntryKind | None = None,
) -> None:
    """Credit a refund to the periods of the charge (with `kind` FEE or FLOOR: what was taken
    under that kind given back, to its periods); the caller checked it is refundable."""
    if kind is not None:
        charges = _by_period(session, budget, kind, batch_id, sign=-1)
        refunds = _by_period(session, budget, kind, batch_id, sign=1)
    else:
        charges = _by_period(session, budget, EntryKind.CHARGE, batch_id)
        refunds = _by_period(session, budget, EntryKind.REFUND, batch_id)
    left = amount_micros
    first = True
    for start in sorted(charges, reverse=True):
        part = min(left, charges[start] - refunds[start])
        if part <= 0:
            continue
        left -= part
        part_key = _part_key(key, first, start)
        first = False
        post(
            session,
            account,
            kind or EntryKind.REFUND,
            part,
            key=part_key,
            now=now,
            reason=reason,
            batch_id=batch_id,
            request_id=rid,
            period_start=start,
        )
        expire_ended(
            session,
            account,
            budget,
            start,
            part,
            key=f"expire-{part_key}",
            reason=f"refund of batch {batch_id} credited to its ended period",
            now=now,
        )
    assert left == 0, "the caller checks that the refund does not exceed what was paid"
