"""Settling a cleared batch: the batch and its requests, every user's charge, the releases.

All of it happens in one transaction, so a batch is either fully settled or not at all. A batch
id is settled once: replaying the same contents returns the first result and writes nothing
(a different `closed_at` counts as the same contents; the first is kept), while other
contents under the same id raise `IdempotencyConflict`. Each charge counts in the budget
periods its holds were placed in (`billing.period_charges`).

A settlement runs once per auction batch on the server's ledger writer, so it costs a fixed
number of statements whatever the batch's size, sent to the driver directly
(`billing.driver_sql`): the locked accounts are plain rows (`billing.postings.Account`), each
table is written by one statement, and no row goes through the ORM's identity map unless a
budget period has to be opened.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, cast

from sqlalchemy import Table, select
from sqlalchemy.orm import Session

from inference_auctions.billing.driver_sql import Columns, driver_cursor
from inference_auctions.billing.errors import (
    ChargeExceedsHold,
    HoldNotOpen,
    IdempotencyConflict,
    InvalidBatch,
    UnknownRequest,
)
from inference_auctions.billing.fees import fee_key, floor_key, hold_micros, user_fees
from inference_auctions.billing.grants import open_periods
from inference_auctions.billing.holds import HoldRow, KnownHolds, release_entry
from inference_auctions.billing.inputs import BatchInput, RequestInput
from inference_auctions.billing.models import (
    AUCTION_REQUESTS,
    HOLDS,
    AuctionBatch,
    BatchRequest,
    EntryKind,
    HoldState,
    LedgerEntry,
    RequestStatus,
    User,
)
from inference_auctions.billing.money import check_micros, check_total_micros
from inference_auctions.billing.period_charges import charge_entries
from inference_auctions.billing.periods import require_aware
from inference_auctions.billing.postings import (
    Account,
    check_id,
    check_name,
    insert_entries,
    lock_accounts,
    write_balances,
)
from inference_auctions.billing.views import ClaimedBatch, SettleResult

# The claimable rids -> the cleared batch, its requests and every user's charge.
Clearing = Callable[[list[str]], tuple[BatchInput, Sequence[RequestInput], Mapping[str, int]]]

BATCHES = cast(Table, AuctionBatch.__table__)


@dataclass(frozen=True, slots=True)
class BatchClaim:
    """A closed batch to claim, clear and settle (`settle_claimable`), as a group commit
    carries it (`Ledger.commit_group`). With `fingerprints` (rid -> the payload's), a hold
    placed for another payload under the same rid is not claimed: that candidate is refused
    as `conflict`."""

    candidates: Sequence[tuple[str, str]]
    clear: Clearing
    fingerprints: Mapping[str, str | None] | None = None


# Each runs once per batch, straight on the driver (see `billing.postings`).
_SETTLE_HOLDS = "UPDATE holds SET state = ?, closed_at = ?, batch_id = ? WHERE rid IN ({in})"
_SETTLE_BINDS = Columns(HOLDS, ("state", "closed_at", "batch_id"))
_BATCH_COLUMNS = Columns(
    BATCHES,
    (
        "id",
        "closed_at",
        "n",
        "revenue_micros",
        "welfare_micros",
        "tree_nodes",
        "tree_depth",
        "shared_tokens",
        "total_tokens",
        "fingerprint",
        "settled_at",
        "pricing_rule",
        "priority_slots",
        "request_fee_micros",
    ),
)
_REQUEST_COLUMNS = Columns(
    AUCTION_REQUESTS,
    (
        "rid",
        "batch_id",
        "user_id",
        "position",
        "priority",
        "bid_micros",
        "prompt_tokens",
        "cached_tokens",
        "ttft_ms",
        "status",
        "updated_at",
        "arrival",
        "tree_path",
    ),
)
# With a posted price floor only: a batch without one writes the rows it always wrote.
_FLOOR_REQUEST_COLUMNS = Columns(AUCTION_REQUESTS, (*_REQUEST_COLUMNS.names, "floor_micros"))

_COUNTS = ("n", "tree_nodes", "tree_depth", "shared_tokens", "total_tokens")


def charge_key(user_id: int, batch_id: str) -> str:
    """Idempotency key of a user's charge in a batch."""
    return f"charge:{user_id}:{batch_id}"


class _SettledBefore(Exception):
    """The batch being settled turned out settled already, once its users were locked."""


def settle_batch(
    session: Session,
    batch: BatchInput,
    requests: Sequence[RequestInput],
    charges: Mapping[str, int],
    now: datetime,
) -> SettleResult:
    """Record the batch, its requests and charges, and release its holds, all at once: the
    one settlement (`settle_claimable`) of a batch cleared beforehand, each of whose holds must
    be claimable; a batch id settled before is replayed instead."""
    _validate(batch, requests, charges)
    fingerprint = _fingerprint(batch, requests, charges)

    def cleared(_: list[str]) -> tuple[BatchInput, Sequence[RequestInput], Mapping[str, int]]:
        # Checked again under the locks: a concurrent settlement of this batch locks the same
        # users, so by now it has either committed or not started.
        if _batch_exists(session, batch.batch_id):
            raise _SettledBefore
        return batch, requests, charges

    if not _batch_exists(session, batch.batch_id):
        candidates = [(r.rid, r.user) for r in requests]
        try:
            claimed = settle_claimable(session, candidates, cleared, now, claim_all=True)
        except _SettledBefore:
            pass
        else:
            assert claimed.settled is not None
            return claimed.settled
    return _replay(session, batch.batch_id, fingerprint, charges)


def _batch_exists(session: Session, batch_id: str) -> bool:
    return session.scalar(select(BATCHES.c.id).where(BATCHES.c.id == batch_id)) is not None


def settle_claimable(
    session: Session,
    candidates: Sequence[tuple[str, str]],
    clear: Clearing,
    now: datetime,
    fingerprints: Mapping[str, str | None] | None = None,
    locked: Mapping[str, Account] | None = None,
    known: KnownHolds | None = None,
    *,
    claim_all: bool = False,
) -> ClaimedBatch:
    """Claim the open holds among `candidates` (rid, user), clear those, settle them at once.

    A candidate whose hold is missing, settled, released, another user's or (with
    `fingerprints`) another payload's leaves the batch before `clear` runs, so nobody else's
    request fails for it. `clear` gets the claimable rids in the candidates' order and returns
    the batch to settle; it runs under the locks. `locked`: the accounts this transaction
    already locked (`postings.lock_rows`), moved in place. `known`: what this
    transaction knows of holds already (`billing.holds`), kept up to date. With
    `claim_all` no candidate leaves: a hold that cannot be claimed fails the settlement as a
    whole (`UnknownRequest`, `HoldNotOpen`, `InvalidBatch`), as for a batch cleared before its
    holds were claimed (`settle_batch`).
    """
    accounts = lock_accounts(session, {user for _, user in candidates}, locked)
    known = KnownHolds() if known is None else known
    holds = known.rows(session, [rid for rid, _ in candidates])
    claimable: list[str] = []
    refused: dict[str, str] = {}
    for rid, user in candidates:
        hold = holds.get(rid)
        if claim_all:  # `_settle` checks every hold itself
            claimable.append(rid)
        elif hold is None or hold.user_id != accounts[user].user_id:
            refused[rid] = "unknown"
        elif hold.state != HoldState.OPEN:
            refused[rid] = HoldState(hold.state).value
        elif fingerprints is not None and fingerprints.get(rid) != hold.fingerprint:
            refused[rid] = "conflict"
        else:
            claimable.append(rid)
    if not claimable:
        return ClaimedBatch(settled=None, refused=refused)
    batch, requests, charges = clear(claimable)
    closed_at = _validate(batch, requests, charges)
    if {r.rid for r in requests} != set(claimable):
        raise InvalidBatch(batch.batch_id, "the cleared requests are not the claimed ones")
    settled = _settle(
        session,
        batch,
        closed_at=closed_at,
        requests=requests,
        charges=charges,
        accounts={r.user: accounts[r.user] for r in requests},
        holds=holds,
        fingerprint=_fingerprint(batch, requests, charges),
        now=now,
    )
    known.settled(claimable)
    return ClaimedBatch(settled=settled, refused=refused)


def _validate(
    batch: BatchInput, requests: Sequence[RequestInput], charges: Mapping[str, int]
) -> datetime:
    batch_id = check_id(batch.batch_id, "batch_id")
    closed_at = require_aware(batch.closed_at, "closed_at")
    for name in _COUNTS:
        value = getattr(batch, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise InvalidBatch(batch_id, f"{name} must be a non-negative integer, got {value!r}")
    # Totals over the batch: each charge is capped, their sum only by the column.
    check_total_micros(batch.revenue_micros, "revenue_micros")
    check_total_micros(batch.welfare_micros, "welfare_micros")
    if batch.n != len(requests) or batch.n == 0:
        raise InvalidBatch(batch_id, f"n is {batch.n} but {len(requests)} requests were given")
    _validate_rule(batch)
    rids: set[str] = set()
    for request in requests:
        _validate_request(batch_id, request, batch.n)
        check_micros(request.floor_micros, f"floor_micros of request {request.rid!r}")
        if request.floor_micros > request.bid_micros:
            raise InvalidBatch(
                batch_id,
                f"request {request.rid!r} pays a floor of {request.floor_micros} above its bid"
                f" of {request.bid_micros}",
            )
        if request.rid in rids:
            raise InvalidBatch(batch_id, f"request {request.rid!r} appears twice")
        rids.add(request.rid)
    if sorted(r.position for r in requests) != list(range(batch.n)):
        raise InvalidBatch(batch_id, f"positions must be 0..{batch.n - 1}, each once")
    users = {r.user for r in requests}
    for name, amount in charges.items():
        if name not in users:
            raise InvalidBatch(batch_id, f"charge for user {name!r}, who has no request in it")
        check_micros(amount, f"charges[{name!r}]")
    if sum(charges.values()) != batch.revenue_micros:
        raise InvalidBatch(
            batch_id,
            f"revenue_micros is {batch.revenue_micros} but the charges sum to"
            f" {sum(charges.values())}",
        )
    return closed_at


def _validate_rule(batch: BatchInput) -> None:
    slots, fee = batch.priority_slots, batch.request_fee_micros
    if batch.pricing_rule == "batch-size":
        if slots is not None:
            raise InvalidBatch(batch.batch_id, "priority_slots must be None under 'batch-size'")
    elif batch.pricing_rule in ("fixed-slots", "rolling-slots"):
        if isinstance(slots, bool) or not isinstance(slots, int) or slots < batch.n:
            raise InvalidBatch(
                batch.batch_id,
                f"priority_slots must be an integer >= n ({batch.n}) under"
                f" {batch.pricing_rule!r}, got {slots!r}",
            )
    elif batch.pricing_rule in ("tiers", "fcfs"):
        # A fixed price: no slots to price a delay in, and no fee besides the price.
        if slots is not None or fee:
            raise InvalidBatch(
                batch.batch_id,
                f"priority_slots must be None and request_fee_micros 0 under"
                f" {batch.pricing_rule!r}",
            )
    else:
        raise InvalidBatch(
            batch.batch_id,
            "pricing_rule must be 'batch-size', 'fixed-slots', 'rolling-slots', 'tiers' or"
            " 'fcfs', got"
            f" {batch.pricing_rule!r}",
        )
    check_micros(fee, "request_fee_micros")


def _validate_request(batch_id: str, request: RequestInput, n: int) -> None:
    check_id(request.rid, "rid")
    check_name(request.user, "user")
    check_micros(request.bid_micros, f"bid_micros of request {request.rid!r}")
    where = f"request {request.rid!r}"
    for name, value, bound in (
        ("position", request.position, n - 1),
        ("prompt_tokens", request.prompt_tokens, None),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise InvalidBatch(batch_id, f"{where}: {name} must be a non-negative integer")
        if bound is not None and value > bound:
            raise InvalidBatch(batch_id, f"{where}: {name} {value} is beyond the batch")
    priority = request.priority
    if (
        not isinstance(priority, (int, float))
        or not math.isfinite(priority)
        or not 0 <= priority <= 1
    ):
        raise InvalidBatch(batch_id, f"{where}: priority must be a number in [0, 1]")


def _fingerprint(
    batch: BatchInput, requests: Sequence[RequestInput], charges: Mapping[str, int]
) -> str:
    # Everything the auction decides, but not `closed_at`: a caller retrying a settlement may
    # stamp the batch again, and the time of closing moves no money.
    content: dict[str, object] = {
        "batch": [
            batch.batch_id,
            batch.revenue_micros,
            batch.welfare_micros,
            *(getattr(batch, name) for name in _COUNTS),
        ],
        "requests": sorted(
            [r.position, r.rid, r.user, repr(float(r.priority)), r.bid_micros, r.prompt_tokens]
            for r in requests
        ),
        "charges": sorted((name, amount) for name, amount in charges.items() if amount),
    }
    # The rule only when it is not the paper's, so that the batches settled before it was
    # recorded keep their fingerprints (a retried settlement is told from a conflicting one).
    if (batch.pricing_rule, batch.priority_slots, batch.request_fee_micros) != (
        "batch-size",
        None,
        0,
    ):
        content["rule"] = [batch.pricing_rule, batch.priority_slots, batch.request_fee_micros]
    floors = sorted((r.rid, r.floor_micros) for r in requests if r.floor_micros)
    if floors:  # only with a price floor: the batches settled without one keep their prints
        content["floors"] = floors
    return hashlib.sha256(json.dumps(content, separators=(",", ":")).encode()).hexdigest()


def _settle(
    session: Session,
    batch: BatchInput,
    *,
    closed_at: datetime,
    requests: Sequence[RequestInput],
    charges: Mapping[str, int],
    accounts: dict[str, Account],
    holds: Mapping[str, HoldRow],
    fingerprint: str,
    now: datetime,
) -> SettleResult:
    batch_id = batch.batch_id
    _check_holds(batch_id, requests, accounts, holds, batch.request_fee_micros)
    # Before any hold is released: opening a period expires what is available at that moment.
    open_periods(session, accounts, now)
    held: dict[str, int] = defaultdict(int)
    by_period: dict[str, list[tuple[datetime | None, int]]] = defaultdict(list)
    for request in requests:
        hold = holds[request.rid]
        held[request.user] += hold.amount_micros
        by_period[request.user].append((hold.period_start, hold.amount_micros))
    fees = user_fees((r.user for r in requests), batch.request_fee_micros)
    floors: dict[str, int] = defaultdict(int)
    for request in requests:
        floors[request.user] += request.floor_micros
    for name in accounts:
        amount = charges.get(name, 0) + fees.get(name, 0) + floors[name]
        if amount > held[name]:
            raise ChargeExceedsHold(batch_id, name, amount, held[name])
    cursor = driver_cursor(session)
    # Sent together: one round trip to a database server for all of them.
    with cursor.together():
        # The batch row first (the rows below reference it), then its request rows, the entries
        # and the balances; the holds are closed last. The crash tests rely on that order: a
        # settlement blocked on a hold's row lock has written everything else.
        cursor.insert(
            _BATCH_COLUMNS,
            [
                {
                    "id": batch_id,
                    "closed_at": closed_at,
                    "n": batch.n,
                    "revenue_micros": batch.revenue_micros,
                    "welfare_micros": batch.welfare_micros,
                    "tree_nodes": batch.tree_nodes,
                    "tree_depth": batch.tree_depth,
                    "shared_tokens": batch.shared_tokens,
                    "total_tokens": batch.total_tokens,
                    "fingerprint": fingerprint,
                    "settled_at": now,
                    "pricing_rule": batch.pricing_rule,
                    "priority_slots": batch.priority_slots,
                    "request_fee_micros": batch.request_fee_micros,
                }
            ],
        )
        reason = f"settled in batch {batch_id}"
        ordered = sorted(requests, key=lambda r: r.position)
        cursor.insert(
            _FLOOR_REQUEST_COLUMNS if any(floors.values()) else _REQUEST_COLUMNS,
            [
                _request_row(batch_id, request, accounts[request.user].user_id, now)
                for request in ordered
            ],
        )
        entries = [
            release_entry(
                accounts[request.user],
                holds[request.rid],
                reason=reason,
                now=now,
                batch_id=batch_id,
            )
            for request in ordered
        ]
        for name in sorted(accounts):
            account = accounts[name]
            entries += charge_entries(
                account,
                held=by_period[name],
                charge_micros=charges.get(name, 0),
                key=charge_key(account.user_id, batch_id),
                batch_id=batch_id,
                now=now,
                fee_micros=fees.get(name, 0),
                fee_key=fee_key(account.user_id, batch_id),
                floor_micros=floors[name],
                floor_key=floor_key(account.user_id, batch_id),
            )
        insert_entries(session, entries)
        write_balances(session, [accounts[name] for name in sorted(accounts)], now)
        # Every hold of the batch moves to the same state: one statement.
        rids = [request.rid for request in ordered]
        settled = _SETTLE_BINDS.bind(cursor.dialect)((HoldState.SETTLED, now, batch_id))
        cursor.write(_SETTLE_HOLDS, [*settled, *rids], count=len(rids))
    return SettleResult(
        batch_id=batch_id,
        charges_micros={name: charges.get(name, 0) for name in sorted(accounts)},
        released_micros={name: held[name] for name in sorted(accounts)},
        fees_micros={name: fees[name] for name in sorted(accounts) if fees.get(name)},
        floors_micros={name: floors[name] for name in sorted(accounts) if floors[name]},
    )


def _check_holds(
    batch_id: str,
    requests: Sequence[RequestInput],
    accounts: Mapping[str, Account],
    holds: Mapping[str, HoldRow],
    fee_micros: int,
) -> None:
    for request in requests:
        hold = holds.get(request.rid)
        if hold is None:
            raise UnknownRequest(request.rid)
        if hold.user_id != accounts[request.user].user_id:
            raise InvalidBatch(
                batch_id, f"request {request.rid!r} was held for another user than {request.user!r}"
            )
        if hold.state != HoldState.OPEN:
            raise HoldNotOpen(request.rid, HoldState(hold.state).value)
        if hold_micros(request.bid_micros, fee_micros) > hold.amount_micros:
            fee = f" plus the request fee of {fee_micros}" if fee_micros else ""
            raise InvalidBatch(
                batch_id,
                f"request {request.rid!r} bids {request.bid_micros} micro-credits{fee} but"
                f" holds only {hold.amount_micros}",
            )


def _request_row(
    batch_id: str, request: RequestInput, user_id: int, now: datetime
) -> dict[str, Any]:
    return {
        "rid": request.rid,
        "batch_id": batch_id,
        "user_id": user_id,
        "position": request.position,
        "priority": float(request.priority),
        "bid_micros": request.bid_micros,
        "prompt_tokens": request.prompt_tokens,
        "cached_tokens": None,
        "ttft_ms": None,
        "status": RequestStatus.SCHEDULED,
        "updated_at": now,
        "arrival": request.arrival,
        "tree_path": None
        if request.tree_path is None
        else ".".join(str(int(node)) for node in request.tree_path),
        "floor_micros": request.floor_micros or None,  # written only under a floor
    }


def _replay(
    session: Session, batch_id: str, fingerprint: str, charges: Mapping[str, int]
) -> SettleResult:
    stored = session.get(AuctionBatch, batch_id)
    assert stored is not None
    result = stored_result(session, batch_id)
    if stored.fingerprint != fingerprint:
        differing = sorted(
            name
            for name in set(result.charges_micros) | set(charges)
            if result.charges_micros.get(name, 0) != charges.get(name, 0)
        )
        detail = (
            f"charges differ for {', '.join(map(repr, differing))}"
            if differing
            else "the batch fields or its requests differ"
        )
        raise IdempotencyConflict(f"batch:{batch_id}", detail)
    return SettleResult(
        batch_id=batch_id,
        charges_micros=result.charges_micros,
        released_micros=result.released_micros,
        replayed=True,
        fees_micros=result.fees_micros,
        floors_micros=result.floors_micros,
    )


def stored_result(session: Session, batch_id: str) -> SettleResult:
    """What the settlement of `batch_id` moved, read back from the ledger."""
    users = session.scalars(
        select(User.name)
        .join(BatchRequest, BatchRequest.user_id == User.id)
        .where(BatchRequest.batch_id == batch_id)
        .distinct()
    ).all()
    charged: dict[str, int] = dict.fromkeys(users, 0)
    released: dict[str, int] = dict.fromkeys(users, 0)
    fees: dict[str, int] = dict.fromkeys(users, 0)
    floors: dict[str, int] = dict.fromkeys(users, 0)
    moved = {
        EntryKind.CHARGE: charged,
        EntryKind.RELEASE: released,
        EntryKind.FEE: fees,
        EntryKind.FLOOR: floors,
    }
    rows = session.execute(
        select(User.name, LedgerEntry.kind, LedgerEntry.amount_micros)
        .join(User, User.id == LedgerEntry.user_id)
        .where(
            LedgerEntry.batch_id == batch_id,
            LedgerEntry.kind.in_(list(moved)),
            # A fee or floor given back later (> 0) is a refund's, not the settlement's.
            LedgerEntry.amount_micros <= 0,
        )
    ).all()
    for name, kind, amount in rows:
        moved[kind][name] -= amount
    return SettleResult(
        batch_id=batch_id,
        charges_micros={name: charged[name] for name in sorted(users)},
        released_micros={name: released[name] for name in sorted(users)},
        fees_micros={name: fees[name] for name in sorted(users) if fees[name]},
        floors_micros={name: floors[name] for name in sorted(users) if floors[name]},
    )
