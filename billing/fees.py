"""The request fee (docs/SPEC.md section 5): what every request pays besides its VCG charge;
and the posted price floor (section 7), what an entrant of the rolling auction pays besides it.

One rule for admission, settlement and refunds: a request holds its bid plus the fee
(`hold_micros`); its batch's settlement takes the fees of a user's requests as `fee` entries
beside the user's charge (`user_fees`, `fee_key`); a request recorded failed gets its own fee
back, once (`refund_fee`); one served or abandoned keeps it. Zero bids pay it too: that is
what makes a decoy request cost its sender.

The floor follows the same life, per request: each request's part (`RequestInput.floor_micros`,
stored with it) is taken as `floor` entries beside its user's charge (`floor_key`), and given
back, once, to a request recorded failed (`refund_floor`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from sqlalchemy import Select, select
from sqlalchemy.orm import Session

from inference_auctions.billing import period_charges
from inference_auctions.billing.models import (
    REASON_LENGTH,
    AuctionBatch,
    BatchRequest,
    Budget,
    EntryKind,
    LedgerEntry,
)
from inference_auctions.billing.postings import Account


def hold_micros(bid_micros: int, fee_micros: int) -> int:
    """What a request holds from its user's budget until its batch settles: bid plus fee."""
    return bid_micros + fee_micros


def user_fees(users: Iterable[str], fee_micros: int) -> dict[str, int]:
    """Each user's fees in a batch, from the users of its requests (one name per request)."""
    return {user: count * fee_micros for user, count in Counter(users).items()}


def fee_key(user_id: int, batch_id: str) -> str:
    """Idempotency key of a user's request fees in a batch."""
    return f"fee:{user_id}:{batch_id}"


def fee_refund_key(rid: str) -> str:
    """Idempotency key of the fee given back for the failed request `rid`."""
    return f"fee-refund:{rid}"


def refund_fee(
    session: Session,
    account: Account,
    budget: Budget,
    *,
    batch_id: str,
    rid: str,
    reason: str,
    now: datetime,
) -> int:
    """Give back the fee of the failed request `rid` of the locked `account`, once; returns
    what was given back now (0 for a replay, a batch without a fee, or fees already all
    given back)."""
    return _give_back(
        session,
        account,
        budget,
        EntryKind.FEE,
        paid=select(AuctionBatch.request_fee_micros).where(AuctionBatch.id == batch_id),
        key=fee_refund_key(rid),
        reason=f"fee of a failed request: {reason}",
        batch_id=batch_id,
        rid=rid,
        now=now,
    )


def floor_key(user_id: int, batch_id: str) -> str:
    """Idempotency key of a user's part of the price floor in a batch."""
    return f"floor:{user_id}:{batch_id}"


def floor_refund_key(rid: str) -> str:
    """Idempotency key of the price floor given back for the failed request `rid`."""
    return f"floor-refund:{rid}"


def refund_floor(
    session: Session,
    account: Account,
    budget: Budget,
    *,
    batch_id: str,
    rid: str,
    reason: str,
    now: datetime,
) -> int:
    """Give back the price floor the failed request `rid` paid, once; returns what was given
    back now (0 for a replay, a request that paid none, or floors already all given back)."""
    return _give_back(
        session,
        account,
        budget,
        EntryKind.FLOOR,
        paid=select(BatchRequest.floor_micros).where(BatchRequest.rid == rid),
        key=floor_refund_key(rid),
        reason=f"price floor of a failed request: {reason}",
        batch_id=batch_id,
        rid=rid,
        now=now,
    )


def _give_back(
    session: Session,
    account: Account,
    budget: Budget,
    kind: EntryKind,
    *,
    paid: Select[Any],
    key: str,
    reason: str,
    batch_id: str,
    rid: str,
    now: datetime,
) -> int:
    """Give back, under `key` and once, what the failed request `rid` paid under `kind` (the
    query `paid`), never more than its user's `kind` entries in the batch took and have not
    given back yet; returns what was given back now."""
    # The key first: a replay reads nothing more and writes nothing.
    if session.scalar(select(LedgerEntry.id).where(LedgerEntry.idempotency_key == key)):
        return 0
    paid_micros = session.scalar(paid)
    if not paid_micros:
        return 0
    taken, back = period_charges.taken_and_given_back(session, budget, kind, batch_id)
    amount = min(int(paid_micros), taken - back)
    if amount <= 0:
        return 0
    period_charges.post_refund(
        session,
        account,
        budget,
        amount_micros=amount,
        key=key,
        reason=reason[:REASON_LENGTH],
        batch_id=batch_id,
        rid=rid,
        now=now,
        kind=kind,
    )
    return amount
