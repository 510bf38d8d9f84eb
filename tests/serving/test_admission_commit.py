"""A request's hold and the settlement of the batch it closes share one ledger commit.

The service is driven in process (no HTTP) so that several requests arrive in one turn of
the event loop: each queues its hold and joins the pool before anything is committed, the
pool closes one batch over all of them, and the writer's next group commit places the holds,
then claims, clears and settles the batch. What the tests pin down: a lone request costs one
commit before dispatch (not two), and a request refused in that same commit (its budget, or
its rid already held for another payload) leaves the batch alone: the others are served and
charged, nothing is charged for it, nothing of anyone else's is touched.
"""

from __future__ import annotations

import asyncio

import pytest

from inference_auctions.billing import HoldInput, HoldState
from inference_auctions.server.errors import Conflict, PaymentRequired, ServiceError
from inference_auctions.server.serving.admission import ledger_rid
from inference_auctions.server.serving.service import AuctionService
from inference_auctions.server.serving.tickets import Ticket
from tests.db_fixtures import MigratedDatabase
from tests.server.in_process import admit, running_service


def _commits_and_writes(service: AuctionService) -> list[float]:
    """How many group commits so far, and how many writes (holds, claims, served records)
    they carried in all."""
    [metric] = service.metrics.ledger_group_writes.collect()
    count = next(s.value for s in metric.samples if s.name.endswith("_count"))
    total = next(s.value for s in metric.samples if s.name.endswith("_sum"))
    return [count, total]


@pytest.mark.anyio
async def test_a_lone_request_is_held_and_settled_in_one_commit(
    ledger_db: MigratedDatabase,
) -> None:
    await _lone_request(ledger_db)


async def _lone_request(ledger_db: MigratedDatabase) -> None:
    async with running_service(ledger_db) as service:
        service.ledger.create_user("ada", budget_micros=1_000_000)
        ticket = await admit(service, "ada", "r1", 5_000)
        clearance = await ticket.wait_cleared()
        await ticket.result()
        # Two commits in all: hold + claim together, then the served record.
        assert _commits_and_writes(service) == [2, 3]
        assert clearance.batch_size == 1
        assert service.ledger.balance("ada").held_micros == 0
        assert service.ledger.reconcile().ok


@pytest.mark.anyio
async def test_a_request_refused_in_its_batchs_commit_leaves_the_others_served(
    ledger_db: MigratedDatabase,
) -> None:
    await _refused_in_the_same_commit(ledger_db)


async def _refused_in_the_same_commit(ledger_db: MigratedDatabase) -> None:
    async with running_service(ledger_db) as service:
        ledger = service.ledger
        ledger.create_user("ada", budget_micros=6_000)  # one bid of 5,000, not two
        ledger.create_user("bob", budget_micros=1_000_000)
        outcomes = await asyncio.gather(
            admit(service, "ada", "a1", 5_000),
            admit(service, "ada", "a2", 5_000),
            admit(service, "bob", "b1", 4_000),
            return_exceptions=True,
        )
        refused = [o for o in outcomes if isinstance(o, ServiceError)]
        tickets = [o for o in outcomes if isinstance(o, Ticket)]
        assert [type(e) for e in refused] == [PaymentRequired]
        assert len(tickets) == 2
        clearances = [await t.wait_cleared() for t in tickets]
        for ticket in tickets:
            await ticket.result()
        # All three arrived in one turn: one batch, one commit for its holds and settlement.
        assert {c.batch_id for c in clearances} == {clearances[0].batch_id}
        assert [c.batch_size for c in clearances] == [2, 2]
        assert _commits_and_writes(service)[0] == 2  # holds + claim, then the served records
        assert ledger.balance("ada").held_micros == 0
        assert ledger.balance("bob").held_micros == 0
        assert ledger.reconcile().ok


@pytest.mark.anyio
async def test_a_rid_held_for_another_payload_is_not_claimed_for_this_one(
    ledger_db: MigratedDatabase,
) -> None:
    await _held_for_another_payload(ledger_db)


async def _held_for_another_payload(ledger_db: MigratedDatabase) -> None:
    async with running_service(ledger_db) as service:
        ledger = service.ledger
        ledger.create_user("ada", budget_micros=1_000_000)
        ledger.create_user("bob", budget_micros=1_000_000)
        # Another replica holds ada's rid r1 for another payload, and has not settled it.
        other = HoldInput("ada", ledger_rid("ada", "r1"), 9_000, "f" * 64)
        [placed] = ledger.place_holds([other])
        assert placed.state is HoldState.OPEN
        outcomes = await asyncio.gather(
            admit(service, "ada", "r1", 5_000),
            admit(service, "bob", "b1", 4_000),
            return_exceptions=True,
        )
        assert isinstance(outcomes[0], Conflict)
        assert isinstance(outcomes[1], Ticket)
        clearance = await outcomes[1].wait_cleared()
        await outcomes[1].result()
        assert clearance.batch_size == 1
        # The other replica's hold is untouched, still open for its own batch.
        assert ledger.balance("ada").held_micros == 9_000
        assert ledger.balance("ada").balance_micros == 1_000_000
        assert ledger.reconcile().ok
