"""Outcomes of settled requests, and recovery after a crash: refund what was never served.

A server settles a batch before it dispatches it, then records each request's outcome before
its client receives the final byte: `served`, or `failed` together with the request's refund
(one transaction). Both writes move a request out of `scheduled` only if it is still there, so
`refund_unserved` (which fails and refunds requests `scheduled` for longer than a threshold)
and a server answering the same request exclude each other: whichever commits first wins, and
a server that loses answers 503 instead of the output. Recovery is therefore safe at any time,
on any replica, while servers run; a request it fails is one whose client got no answer.

Refunds follow SPEC section 1, "When requests fail": a user gets back what the failed requests'
bids added to the user's charge, never more than the charge, and each failed request's fee and
price floor.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from inference_auctions.billing import fees, period_charges, refunds
from inference_auctions.billing.errors import RequestNotScheduled
from inference_auctions.billing.grants import open_period
from inference_auctions.billing.models import (
    AuctionBatch,
    BatchRequest,
    Budget,
    RequestStatus,
    User,
)
from inference_auctions.billing.postings import lock_account
from inference_auctions.billing.request_log import finish_scheduled
from inference_auctions.billing.views import PricedRequestView, RefundResult, RefundRule

REASON = (
    "not served: the server stopped, or could not record the answer, while it was at the engine"
)


def stale_scheduled(session: Session, cutoff: datetime) -> list[tuple[str, str, str]]:
    """(rid, batch id, user) of requests still `scheduled` since before `cutoff` (no lock)."""
    rows = session.execute(
        select(BatchRequest.rid, BatchRequest.batch_id, User.name)
        .join(User, User.id == BatchRequest.user_id)
        .where(BatchRequest.status == RequestStatus.SCHEDULED, BatchRequest.updated_at < cutoff)
        .order_by(BatchRequest.batch_id, BatchRequest.position)
    ).all()
    return [(rid, batch_id, name) for rid, batch_id, name in rows]


def fail_request(
    session: Session,
    rid: str,
    batch_id: str,
    name: str,
    *,
    target_micros: int | None,
    rule: RefundRule | None,
    reason: str,
    now: datetime,
    scheduled_before: datetime | None = None,
) -> RefundResult:
    """Record `rid` failed (only if still scheduled) and refund its user by the rule.

    `target_micros` is the user's refund for every failed request of the batch so far, as the
    caller priced it; None prices it here with `rule` from the stored tree shape.
    """
    # The account lock first: two failures of one user's requests then refund in turn.
    account = lock_account(session, name)
    finish_scheduled(
        session,
        rid,
        status=RequestStatus.FAILED,
        cached_tokens=None,
        ttft_ms=None,
        now=now,
        scheduled_before=scheduled_before,
    )
    if target_micros is None:
        target_micros = _price_failures(session, batch_id, name, rule)
    refunded = refunds.refund_toward(
        session, batch_id, name, rid=rid, target_micros=target_micros, reason=reason, now=now
    )
    # The request's own fee comes back with it, by the same rule as its charge: it was not
    # served (a served or abandoned request keeps its fee, as it keeps its charge).
    budget = open_period(session, account, now)
    fee = fees.refund_fee(
        session, account, budget, batch_id=batch_id, rid=rid, reason=reason, now=now
    )
    # And the price floor it paid (docs/SPEC.md section 7), by the same rule.
    floor = fees.refund_floor(
        session, account, budget, batch_id=batch_id, rid=rid, reason=reason, now=now
    )
    return replace(refunded, fee_micros=fee, floor_micros=floor) if fee or floor else refunded


def recover_request(
    session: Session,
    rid: str,
    batch_id: str,
    name: str,
    *,
    rule: RefundRule | None,
    cutoff: datetime,
    now: datetime,
) -> RefundResult | None:
    """Fail and refund one stale request; None if it was served or failed meanwhile."""
    try:
        return fail_request(
            session,
            rid,
            batch_id,
            name,
            target_micros=None,
            rule=rule,
            reason=REASON,
            now=now,
            scheduled_before=cutoff,
        )
    except RequestNotScheduled:
        return None


def _price_failures(session: Session, batch_id: str, name: str, rule: RefundRule | None) -> int:
    slots, pricing_rule = session.execute(
        select(AuctionBatch.priority_slots, AuctionBatch.pricing_rule).where(
            AuctionBatch.id == batch_id
        )
    ).one()
    rows = session.execute(
        select(BatchRequest, User.name)
        .join(User, User.id == BatchRequest.user_id)
        .where(BatchRequest.batch_id == batch_id)
        .order_by(BatchRequest.position)
        .execution_options(populate_existing=True)
    ).all()
    account_id = next(request.user_id for request, owner in rows if owner == name)
    budget = session.get(Budget, account_id)
    charge = 0 if budget is None else period_charges.charged(session, budget, batch_id)
    failed = frozenset(
        request.rid
        for request, owner in rows
        if owner == name and request.status is RequestStatus.FAILED
    )
    priced = [PricedRequestView.of(request, owner, slots, pricing_rule) for request, owner in rows]
    if rule is None or any(p.arrival is None or p.tree_path is None for p in priced):
        # Without the tree's shape (batches settled before it was stored) the batch cannot be
        # priced again: the whole charge is refunded, as it always was for such batches.
        return charge
    return rule(priced, name, failed, charge)
