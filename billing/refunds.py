"""Refunds of charges, for requests the engine failed to serve.

A refund gives back (part of) one user's charge in one batch. The total refunded never exceeds
the charge. Without `rid`, a refund is keyed by (user, batch) and happens once; with `rid`, by
the request, so several requests of one user in a batch can each be refunded once. A refund
is credited to the budget periods of the charge it refunds (`billing.period_charges`).
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from inference_auctions.billing import period_charges
from inference_auctions.billing.errors import (
    IdempotencyConflict,
    InvalidInput,
    RefundExceedsCharge,
    UnknownBatch,
)
from inference_auctions.billing.grants import open_period
from inference_auctions.billing.models import AuctionBatch, BatchRequest, EntryKind, LedgerEntry
from inference_auctions.billing.money import check_micros
from inference_auctions.billing.postings import check_id, check_reason, lock_account
from inference_auctions.billing.views import RefundResult


def refund(
    session: Session,
    batch_id: str,
    name: str,
    *,
    reason: str,
    amount_micros: int | None,
    rid: str | None,
    now: datetime,
) -> RefundResult:
    """Refund `amount_micros` (default: all that is left) of the user's charge in the batch."""
    check_id(batch_id, "batch_id")
    check_reason(reason)
    if amount_micros is not None:
        check_micros(amount_micros, "amount_micros", positive=True)
    if rid is not None:
        check_id(rid, "rid")
    if session.get(AuctionBatch, batch_id) is None:
        raise UnknownBatch(batch_id)
    account = lock_account(session, name)
    budget = open_period(session, account, now)
    user_id = account.user_id
    if rid is not None:
        request = session.get(BatchRequest, rid)
        if request is None or request.batch_id != batch_id or request.user_id != user_id:
            raise InvalidInput(
                "rid", f"request {rid!r} is not one of {name!r}'s in batch {batch_id!r}"
            )
    charged = period_charges.charged(session, budget, batch_id)
    refunded = _refunded(session, user_id, batch_id)
    key = f"refund:{user_id}:{batch_id}" if rid is None else f"refund-request:{rid}"
    existing = period_charges.recorded_refund(session, user_id, batch_id, rid)
    if existing is not None:
        if amount_micros is not None and amount_micros != existing:
            raise IdempotencyConflict(
                key, f"refunded {existing} micro-credits, now {amount_micros}"
            )
        return RefundResult(batch_id, name, existing, charged, refunded)
    refundable = charged - refunded
    amount = refundable if amount_micros is None else amount_micros
    if amount > refundable:
        raise RefundExceedsCharge(batch_id, name, amount, refundable)
    if amount == 0:
        return RefundResult(batch_id, name, 0, charged, refunded)
    period_charges.post_refund(
        session,
        account,
        budget,
        amount_micros=amount,
        key=key,
        reason=reason,
        batch_id=batch_id,
        rid=rid,
        now=now,
    )
    return RefundResult(batch_id, name, amount, charged, refunded + amount)


def _refunded(session: Session, user_id: int, batch_id: str) -> int:
    total = session.scalar(
        select(func.coalesce(func.sum(LedgerEntry.amount_micros), 0)).where(
            LedgerEntry.user_id == user_id,
            LedgerEntry.batch_id == batch_id,
            LedgerEntry.kind == EntryKind.REFUND,
        )
    )
    return int(total or 0)


def refund_toward(
    session: Session,
    batch_id: str,
    name: str,
    *,
    rid: str,
    target_micros: int,
    reason: str,
    now: datetime,
) -> RefundResult:
    """Bring the user's refunds in the batch up to `target_micros` (capped at the charge).

    Keyed by the failed request `rid`: the k-th failure of a user's requests refunds the rule's
    value for all of them so far minus what earlier failures refunded, and nothing when that is
    not positive. A replay returns the first result.
    """
    check_id(batch_id, "batch_id")
    check_id(rid, "rid")
    check_reason(reason)
    check_micros(target_micros, "target_micros")
    if session.get(AuctionBatch, batch_id) is None:
        raise UnknownBatch(batch_id)
    account = lock_account(session, name)
    budget = open_period(session, account, now)
    user_id = account.user_id
    charged = period_charges.charged(session, budget, batch_id)
    refunded = _refunded(session, user_id, batch_id)
    existing = period_charges.recorded_refund(session, user_id, batch_id, rid)
    if existing is not None:
        return RefundResult(batch_id, name, existing, charged, refunded)
    amount = min(target_micros, charged) - refunded
    if amount <= 0:
        return RefundResult(batch_id, name, 0, charged, refunded)
    period_charges.post_refund(
        session,
        account,
        budget,
        amount_micros=amount,
        key=f"refund-request:{rid}",
        reason=reason,
        batch_id=batch_id,
        rid=rid,
        now=now,
    )
    return RefundResult(batch_id, name, amount, charged, refunded + amount)
