"""One group commit's transaction: holds, then claimed batches, then served records.

What a group-commit writer collected since its last commit runs in one transaction
(`Ledger.commit_group`): the holds are placed first, so a batch closed while its requests'
holds were still on their way claims them in the same transaction; then each batch is
claimed, cleared and settled; then the served records move their requests out of
`scheduled`. Every user involved is locked once, first, in name order (so two replicas'
groups never wait on each other in a cycle, and balance rows are locked before request rows,
in the order recovery takes them), and the locked rows pass from one part to the next.

The transaction reads everything it needs first, in one round trip to a database server
(`DriverCursor.read_together`, with the `BEGIN`: `billing.postgres_connection`): the users'
locked rows and the holds of every rid it places or claims. Its writes are then deferred and
sent all together (`DriverCursor.defer_writes`), with the served records' updates, which say
themselves whether they moved their requests, before the `COMMIT`: a group costs three round
trips whatever it carries (seven for a lone request's hold and settlement before; a lone
served record is one statement, `Ledger.commit_group`). What it writes itself it keeps track of
instead of reading back: a claim finds the holds its own group placed (`billing.holds`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from sqlalchemy.exc import DBAPIError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from sqlalchemy.orm import Session

from inference_auctions.billing import holds, postings, request_log, settlement
from inference_auctions.billing.driver_sql import driver_cursor
from inference_auctions.billing.errors import LedgerError
from inference_auctions.billing.holds import KnownHolds
from inference_auctions.billing.inputs import HoldInput, ServedInput
from inference_auctions.billing.postings import check_id
from inference_auctions.billing.views import ClaimedBatch, HoldView

__all__ = ["ClaimFailed", "GroupOutcome", "commit_group"]


@dataclass(frozen=True, slots=True)
class GroupOutcome:
    """What one group commit decided, item by item in the order given."""

    placed: list[HoldView | LedgerError]  # each hold's view, or the error refusing it
    served: list[bool]  # whether each record moved its request to `served`
    claimed: list[ClaimedBatch | Exception]  # each claim's batch, or the error that undid it
    # What each user of the group had available once it committed, for those whose next hold
    # depends on nothing else (enabled, no batch cap): a server's estimate of what it may
    # dispatch before the next commit confirms it (`server.ledger_writer.writer`).
    available: dict[str, int] = field(default_factory=dict)


class ClaimFailed(Exception):
    """A claim of a group commit raised `error`: the group runs again without it."""

    def __init__(self, index: int, error: Exception) -> None:
        super().__init__(f"claim {index} failed: {error}")
        self.index = index
        self.error = error


def commit_group(
    session: Session,
    requests: Sequence[HoldInput],
    records: Sequence[ServedInput],
    claims: Sequence[settlement.BatchClaim],
    now: datetime,
    failed: Mapping[int, Exception],
    *,
    defer: bool = True,
) -> GroupOutcome:
    """The group's work in `session`'s transaction (see the module docstring). The claims of
    `failed` (index -> error) are left out with their error as their result; a claim that
    raises anything but a lost transaction raises `ClaimFailed`. Without `defer`, each
    write is sent as it is made, so a claim's constraint violation is raised as its own."""
    cursor = driver_cursor(session)
    if defer:
        cursor.defer_writes()
    users = {r.user for r in requests} | {u for c in claims for _, u in c.candidates}
    known = KnownHolds()
    rids = [r.rid for r in requests] + [rid for c in claims for rid, _ in c.candidates]
    lock = postings.lock_query(session, users)
    hold_query = known.query(_usable_ids(rids))
    # In this order: the users' rows are locked before their holds are read.
    wanted = [query for query in (lock, hold_query) if query is not None]
    rows = iter(cursor.read_together(wanted))
    locked = {} if lock is None else postings.locked_accounts(session, next(rows))
    if hold_query is not None:
        known.learn(hold_query, next(rows), session)

    placed = holds.place_holds(session, requests, now, locked, known) if requests else []
    claimed: list[ClaimedBatch | Exception] = []
    for index, claim in enumerate(claims):
        if index in failed:
            claimed.append(failed[index])
            continue
        try:
            batch = settlement.settle_claimable(
                session, claim.candidates, claim.clear, now, claim.fingerprints, locked, known
            )
        except (OperationalError, PoolTimeout):
            raise  # the transaction itself is lost: the whole group fails
        except DBAPIError as error:
            if defer:  # it may be an earlier claim's deferred write: not this claim's alone
                raise
            raise ClaimFailed(index, error) from error
        except Exception as error:
            raise ClaimFailed(index, error) from error
        claimed.append(batch)
    served = request_log.serve_scheduled(session, records, now) if records else []
    return GroupOutcome(placed, served, claimed, _available(locked))


def _usable_ids(rids: Iterable[str]) -> list[str]:
    """Those of `rids` that are valid ids; the others are refused later, on their own."""
    usable = []
    for rid in rids:
        try:
            usable.append(check_id(rid, "rid"))
        except LedgerError:
            continue
    return usable


def _available(locked: Mapping[str, postings.Account]) -> dict[str, int]:
    """Each locked user's available funds, where nothing but those funds decides a hold."""
    return {
        name: row.available
        for name, row in locked.items()
        if not row.disabled and row.budget.batch_cap_micros is None
    }
