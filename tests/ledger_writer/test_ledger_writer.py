"""The group-commit writer under many concurrent holds and records for the same users.

Real databases (an SQLite file and PostgreSQL): never below zero, nothing lost, nothing
counted twice, and the writes really are grouped; with the commits on a thread of the test's
process and in a writer process of their own (`server.ledger_writer.writer`).
"""

from __future__ import annotations

import asyncio
import threading
from datetime import UTC, datetime, timedelta

import pytest

from inference_auctions.billing import (
    HoldInput,
    HoldState,
    HoldView,
    InsufficientFunds,
    Ledger,
    RequestStatus,
    ServedInput,
)
from inference_auctions.server.ledger_writer.writer import LedgerWriter
from inference_auctions.server.serving.clearing import BatchClearing
from inference_auctions.server.serving.tickets import Ticket

USERS = [f"writer{u}" for u in range(4)]
BUDGET = 1_000_000
AMOUNT = 30_000  # 33 holds fit a budget, the 34th does not
PER_USER = 60


def _ticket(user: str, rid: str, bid: int) -> Ticket:
    return Ticket(
        user=user,
        rid=rid,
        ledger_rid=f"{user}/{rid}",
        tokens=[1, 2, 3, len(rid)],
        bid_micros=bid,
        sampling_params={},
        fingerprint="f",
    )


async def _hold_all(writer: LedgerWriter) -> list[HoldView | BaseException]:
    calls = [
        writer.queue_hold(HoldInput(user, f"{user}/r{i}", AMOUNT, "f"))
        for i in range(PER_USER)
        for user in USERS
    ]
    # Retries of the same requests, racing their originals: they must not hold twice.
    calls += [
        writer.queue_hold(HoldInput(user, f"{user}/r{i}", AMOUNT, "f"))
        for user in USERS
        for i in range(5)
    ]
    return await asyncio.gather(*calls, return_exceptions=True)


@pytest.mark.anyio
async def test_concurrent_holds_never_overspend_and_nothing_is_lost(ledger: Ledger) -> None:
    for user in USERS:
        ledger.create_user(user, budget_micros=BUDGET)

    groups: list[int] = []

    async def run() -> list[HoldView | BaseException]:
        writer = LedgerWriter(ledger, observe_group=groups.append)
        try:
            return await _hold_all(writer)
        finally:
            await writer.close()

    results = await run()
    placed = [r for r in results if isinstance(r, HoldView)]
    refused = [r for r in results if isinstance(r, BaseException)]
    assert all(isinstance(r, InsufficientFunds) for r in refused), refused[:3]
    fits = BUDGET // AMOUNT
    for user in USERS:
        rids = {h.rid for h in placed if h.user == user}
        # Exactly as many as fit: fewer would mean a genuine hold was refused.
        assert len(rids) == fits
        balance = ledger.balance(user)
        assert balance.held_micros == fits * AMOUNT
        assert balance.available_micros == BUDGET - fits * AMOUNT >= 0
        for rid in rids:  # a replay returns the hold as it is, without holding again
            assert ledger.place_hold(user, rid, AMOUNT, "f").state is HoldState.OPEN
        assert ledger.balance(user).held_micros == fits * AMOUNT
    # Grouped: far fewer transactions than holds.
    assert sum(groups) == len(results)
    assert len(groups) < len(results) / 4
    assert ledger.reconcile().ok


@pytest.mark.anyio
async def test_served_records_race_recovery_and_each_request_ends_once(ledger: Ledger) -> None:
    clock_now = datetime.now(UTC)
    for user in USERS:
        ledger.create_user(user, budget_micros=BUDGET)
    tickets = [_ticket(user, f"s{i}", 10_000 + i) for user in USERS for i in range(10)]

    async def run() -> tuple[list[object], int]:
        writer = LedgerWriter(ledger)
        try:
            for ticket in tickets:
                await writer.queue_hold(
                    HoldInput(ticket.user, ticket.ledger_rid, ticket.bid_micros, "f")
                )
            clearing = BatchClearing(tickets, "batch-writer", lambda: clock_now)
            cleared = clearing.cleared(await writer.claim(clearing.claim))
            assert cleared.batch is not None and not cleared.refused
            # What the server tells each client it pays is what the ledger charged, wherever
            # the auction ran (in a writer process, it is run again here).
            for user in USERS:
                charged = sum(
                    -e.amount_micros for e in ledger.entries(user).entries if e.kind == "charge"
                )
                assert cleared.batch.charge(user) == charged
            records = [ServedInput(t.ledger_rid, 0, 1.0) for t in tickets]
            # Recovery fails every still-scheduled request while the records are in flight.
            recovery = asyncio.to_thread(ledger.refund_unserved, timedelta(0))
            outcomes = await asyncio.gather(
                *(writer.served(r) for r in records),
                *(writer.served(r) for r in records[:5]),  # recorded twice: the second is False
                recovery,
                return_exceptions=True,
            )
            refunds = outcomes[-1]
            assert isinstance(refunds, list)
            return list(outcomes[:-1]), len(refunds)
        finally:
            await writer.close()

    outcomes, _ = await run()
    assert not [o for o in outcomes if isinstance(o, BaseException)]
    first, again = outcomes[: len(tickets)], outcomes[len(tickets) :]
    assert not any(again), "a request was recorded served twice"
    served = {t.ledger_rid for t, ok in zip(tickets, first, strict=True) if ok}
    for ticket in tickets:
        view = ledger.find_request(ticket.ledger_rid)
        assert view is not None
        expected = RequestStatus.SERVED if ticket.ledger_rid in served else RequestStatus.FAILED
        assert view.status is expected
    assert ledger.reconcile().ok


@pytest.mark.anyio
@pytest.mark.parametrize("group", [1, 7])
async def test_a_bounded_group_still_takes_every_hold(ledger: Ledger, group: int) -> None:
    ledger.create_user("bounded", budget_micros=BUDGET)

    sizes: list[int] = []

    async def run() -> list[HoldView]:
        writer = LedgerWriter(ledger, max_group=group, observe_group=sizes.append)
        try:
            return await asyncio.gather(
                *(
                    writer.queue_hold(HoldInput("bounded", f"bounded/{i}", 1_000, None))
                    for i in range(40)
                )
            )
        finally:
            await writer.close()

    views = await run()
    assert len({v.rid for v in views}) == 40
    assert sum(sizes) == 40 and max(sizes) <= group  # every hold counted, in bounded groups
    assert ledger.balance("bounded").held_micros == 40_000


@pytest.mark.anyio
async def test_the_writer_knows_what_each_user_can_afford_between_commits(ledger: Ledger) -> None:
    ledger.create_user("ada", budget_micros=100_000)
    ledger.create_user("capped", budget_micros=100_000, batch_cap_micros=50_000)

    async def run() -> list[bool]:
        writer = LedgerWriter(ledger)
        seen = [writer.affords_queued("ada")]  # nothing committed yet: unknown
        await writer.queue_hold(HoldInput("ada", "ada/1", 30_000, "f"))
        await writer.queue_hold(HoldInput("capped", "capped/1", 1_000, "f"))
        seen.append(writer.affords_queued("ada"))  # 70,000 available, nothing queued
        pending = [writer.queue_hold(HoldInput("ada", f"ada/{i}", 30_000, "f")) for i in (2, 3)]
        seen.append(writer.affords_queued("ada"))  # 60,000 queued of 70,000
        pending.append(writer.queue_hold(HoldInput("ada", "ada/4", 30_000, "f")))
        seen.append(writer.affords_queued("ada"))  # 90,000 queued: more than the last commit told
        results = await asyncio.gather(*pending, return_exceptions=True)
        assert [isinstance(r, InsufficientFunds) for r in results] == [False, False, True]
        seen.append(writer.affords_queued("ada"))  # 10,000 available, nothing queued
        seen.append(writer.affords_queued("capped"))  # a batch cap decides holds: never estimated
        await writer.close()
        return seen

    assert await run() == [False, True, True, False, True, False]


@pytest.mark.anyio
@pytest.mark.parametrize("served_apart", [True, False])
async def test_served_records_have_a_lane_of_their_own_where_asked(
    ledger: Ledger, served_apart: bool
) -> None:
    """With a lane of their own, `served` records commit while the main lane is busy (a slow
    settlement, a refund); without, they wait for it. Either way each is recorded once."""
    ledger.create_user("lanes", budget_micros=BUDGET)
    tickets = [_ticket("lanes", f"l{i}", 1_000 + i) for i in range(3)]
    now = datetime.now(UTC)
    release = threading.Event()

    async def run() -> tuple[bool, list[bool]]:
        writer = LedgerWriter(ledger, served_apart=served_apart)
        try:
            for ticket in tickets:
                await writer.queue_hold(
                    HoldInput(ticket.user, ticket.ledger_rid, ticket.bid_micros, "f")
                )
            clearing = BatchClearing(tickets, "batch-lanes", lambda: now)
            assert clearing.cleared(await writer.claim(clearing.claim)).batch is not None
            busy = asyncio.ensure_future(writer.call(release.wait, 30))
            served = asyncio.gather(
                *(writer.served(ServedInput(t.ledger_rid, 0, 1.0)) for t in tickets)
            )
            done, _ = await asyncio.wait([served], timeout=30 if served_apart else 0.5)
            recorded_while_busy = served in done and not busy.done()
            release.set()
            await busy
            return recorded_while_busy, await served
        finally:
            release.set()
            await writer.close()

    recorded_while_busy, outcomes = await run()
    assert recorded_while_busy is served_apart
    assert outcomes == [True, True, True]
    for ticket in tickets:
        view = ledger.find_request(ticket.ledger_rid)
        assert view is not None and view.status is RequestStatus.SERVED
    assert ledger.reconcile().ok


@pytest.mark.anyio
async def test_the_served_lane_is_the_default_on_a_database_server_only(ledger: Ledger) -> None:
    async def lanes() -> bool:
        writer = LedgerWriter(ledger)
        try:
            return writer.serves_apart
        finally:
            await writer.close()

    assert await lanes() is (ledger.engine.dialect.name == "postgresql")
