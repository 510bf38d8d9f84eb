"""Small builders and probes shared by the ledger tests."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

from sqlalchemy import Engine, text
from sqlalchemy.orm import Session

from inference_auctions.billing import BatchClaim, BatchInput, HoldView, Ledger, RequestInput
from inference_auctions.billing.grants import open_period
from inference_auctions.billing.holds import find_hold
from inference_auctions.billing.models import Budget
from inference_auctions.billing.postings import Account, lock_account


class PartRefund(Protocol):
    """`billing.fees.refund_fee` or `refund_floor`: what a failed request gets back of a kind."""

    def __call__(
        self,
        session: Session,
        account: Account,
        budget: Budget,
        *,
        batch_id: str,
        rid: str,
        reason: str,
        now: datetime,
    ) -> int: ...


TABLES = (
    "users",
    "budgets",
    "balances",
    "ledger_entries",
    "holds",
    "auction_batches",
    "auction_requests",
)


def snapshot(engine: Engine) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of every ledger table, to prove that a refused operation changed nothing."""
    with engine.connect() as connection:
        return {
            table: [
                tuple(row) for row in connection.execute(text(f"SELECT * FROM {table} ORDER BY 1"))
            ]
            for table in TABLES
        }


def batch_of(
    batch_id: str,
    bids: Sequence[tuple[str, str, int]],
    charges: Mapping[str, int],
) -> tuple[BatchInput, list[RequestInput], dict[str, int]]:
    """A batch of (rid, user, bid) in that order, with `charges` per user."""
    n = len(bids)
    requests = [
        RequestInput(
            rid=rid,
            user=user,
            position=k,
            priority=1.0 if n == 1 else (n - 1 - k) / (n - 1),
            bid_micros=bid,
            prompt_tokens=10,
        )
        for k, (rid, user, bid) in enumerate(bids)
    ]
    batch = BatchInput(
        batch_id=batch_id,
        closed_at=datetime(2025, 1, 15, 12, 0, tzinfo=UTC),
        n=n,
        revenue_micros=sum(charges.values()),
        welfare_micros=0,
        tree_nodes=1,
        tree_depth=1,
        shared_tokens=0,
        total_tokens=10 * n,
    )
    return batch, requests, dict(charges)


def claim_of(batch_id: str, bids: Mapping[str, tuple[str, int]], charge: int) -> BatchClaim:
    """A claim of the holds of `bids` (rid -> (user, bid)) for `Ledger.commit_group`, whose
    clearing charges each user `charge` for the claimable ones (`batch_of`)."""

    def clear(rids: list[str]) -> tuple[BatchInput, Sequence[RequestInput], dict[str, int]]:
        users = {bids[rid][0] for rid in rids}
        return batch_of(batch_id, [(rid, *bids[rid]) for rid in rids], dict.fromkeys(users, charge))

    return BatchClaim([(rid, user) for rid, (user, _) in bids.items()], clear)


def hold_and_settle(
    ledger: Ledger,
    batch_id: str,
    bids: Sequence[tuple[str, str, int]],
    charges: Mapping[str, int],
) -> None:
    """Place the holds of `bids`, then settle them as one batch."""
    for rid, user, bid in bids:
        ledger.place_hold(user, rid, bid)
    ledger.settle_batch(*batch_of(batch_id, bids, charges))


def entries_total(ledger: Ledger, name: str) -> int:
    """Sum of the user's balance-moving entries, read through the public API."""
    total = 0
    cursor = None
    while True:
        page = ledger.entries(name, limit=1000, cursor=cursor)
        total += sum(
            e.amount_micros for e in page.entries if e.kind.value not in ("hold", "release")
        )
        if page.next_cursor is None:
            return total
        cursor = page.next_cursor


def get_hold(ledger: Ledger, rid: str) -> HoldView | None:
    """The hold placed for the ledger rid `rid`, if any (the service never needs to ask)."""
    with Session(ledger.engine) as session:
        return find_hold(session, rid)


def refund_part(ledger: Ledger, refund: PartRefund, name: str, batch_id: str, rid: str) -> int:
    """Call `refund` for `rid` of `name` in `batch_id` in a transaction of its own, as recording
    a failure calls it (under the account's lock, in the open period), without recording the
    failure; what it gave back."""
    now = datetime.now(UTC)
    with Session(ledger.engine) as session, session.begin():
        account = lock_account(session, name)
        budget = open_period(session, account, now)
        return refund(
            session, account, budget, batch_id=batch_id, rid=rid, reason="failed again", now=now
        )


def read_calls() -> int:
    """Read system calls this process has made (Linux)."""
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("syscr:"):
            return int(line.split()[1])
    raise AssertionError("no syscr in /proc/self/io")
