"""A batch goes to the engine while its settlement commits; no answer leaves before it.

The service is driven in process on a real ledger (an SQLite file and PostgreSQL), with the
embedded engine. The ledger's group commit is slowed (or failed) from the outside, by wrapping
the real `commit_group`, to make the window between dispatch and commit wide enough to look
into. What the tests pin down:

* once the ledger has told the server what its users can afford, a batch is sent to the engine
  before its commit ends, and its clearance (what lets any reader see the answer) comes only
  after it;
* a batch its commit cannot settle whole (a hold refused after all, because another replica
  spent the budget meanwhile) is cancelled at the engine and cleared again: the others are
  served and charged once, under a new engine rid, with none of the first attempt's output;
* a commit that fails leaves nothing charged, nothing held and nothing running;
* a user whose hold was refused (the budget, a rid held elsewhere) waits for commits again.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from itertools import pairwise
from typing import Any

import pytest
from sqlalchemy.exc import OperationalError

from inference_auctions.billing import (
    BatchClaim,
    GroupOutcome,
    HoldInput,
    HoldState,
    Ledger,
    ServedInput,
)
from inference_auctions.server.errors import Conflict, PaymentRequired, Unavailable
from inference_auctions.server.serving.admission import ledger_rid
from inference_auctions.server.serving.service import AuctionService
from inference_auctions.server.serving.tickets import Chunk, Ticket
from tests.db_fixtures import MigratedDatabase
from tests.server.in_process import admit, running_service

_TOKENS = 8


async def _admit(
    service: AuctionService, user: str, rid: str, bid: int, prompt: list[int] | None = None
) -> Ticket:
    return await admit(service, user, rid, bid, prompt=prompt, max_new_tokens=_TOKENS)


async def _served(service: AuctionService, user: str, rid: str, bid: int) -> Ticket:
    ticket = await _admit(service, user, rid, bid)
    await ticket.result()
    return ticket


async def _known(service: AuctionService, *users: str) -> None:
    """Create the users and serve one request of each, so that a commit has told the writer
    what each can afford."""
    for user in users:
        service.ledger.create_user(user, budget_micros=1_000_000)
    await asyncio.gather(*(_served(service, user, "warm", 1_000) for user in users))


def _spend_elsewhere(ledger: Ledger, user: str) -> int:
    """Another replica holds all but 1,000 of what `user` has available; returns its hold."""
    amount = ledger.balance(user).available_micros - 1_000
    [placed] = ledger.place_holds([HoldInput(user, f"replica2/{user}", amount)])
    assert placed.state is HoldState.OPEN
    return amount


def _count(counter: Any) -> float:
    [metric] = counter.collect()
    return float(next(s.value for s in metric.samples if s.name.endswith("_total")))


def _ttft(service: AuctionService, sample: str = "_sum") -> float:
    """The sum of the first-token times the engine's streams saw, or their `_count`."""
    [metric] = service.metrics.engine_ttft.collect()
    return float(next(s.value for s in metric.samples if s.name.endswith(sample)))


async def _chunks(ticket: Ticket) -> list[Chunk]:
    return [chunk async for chunk in ticket.follow()]


class _Commits:
    """Wraps the ledger's real group commit: a group that settles a batch is slowed by
    `delay` seconds, or fails `failures` times; records when each such group ended."""

    def __init__(
        self,
        ledger: Ledger,
        monkeypatch: pytest.MonkeyPatch,
        *,
        delay: float = 0.0,
        failures: int = 0,
    ) -> None:
        self.ended: list[float] = []
        self._failures = failures
        real = ledger.commit_group

        def commit_group(
            requests: Sequence[HoldInput],
            records: Sequence[ServedInput],
            claims: Sequence[BatchClaim] = (),
        ) -> GroupOutcome:
            if claims:
                time.sleep(delay)
                if self._failures:
                    self._failures -= 1
                    raise OperationalError("COMMIT", {}, Exception("disk I/O error"))
            outcome = real(requests, records, claims)
            if claims:
                self.ended.append(time.monotonic())
            return outcome

        monkeypatch.setattr(ledger, "commit_group", commit_group)


@pytest.mark.anyio
async def test_a_batch_is_at_the_engine_before_its_commit_ends_and_answered_after_it(
    ledger_db: MigratedDatabase, monkeypatch: pytest.MonkeyPatch
) -> None:
    await _ahead_of_the_commit(ledger_db, monkeypatch)


async def _ahead_of_the_commit(db: MigratedDatabase, monkeypatch: pytest.MonkeyPatch) -> None:
    async with running_service(db) as service:
        ledger = service.ledger
        # Unknown to the writer until a commit tells what ada can afford: the first batch
        # waits for its commit.
        await _known(service, "ada")
        assert _count(service.metrics.batches_ahead) == 0
        ttft_before = _ttft(service)
        commits = _Commits(ledger, monkeypatch, delay=0.3)

        first = asyncio.ensure_future(_admit(service, "ada", "r1", 5_000))
        await asyncio.sleep(0.05)  # its batch is at the engine, its commit still running
        joined = await _admit(service, "ada", "r1", 5_000)  # a retry joins the ticket at once
        await joined.when_cleared()
        cleared_at = time.monotonic()
        chunks = await _chunks(joined)
        assert await first is joined

        [commit_ended] = commits.ended
        assert joined.dispatched is not None and joined.dispatched < commit_ended - 0.2
        # The engine produced its first token while the commit was still running...
        assert joined.dispatched + (_ttft(service) - ttft_before) < commit_ended
        # ...and nobody could read it before the commit ended.
        assert cleared_at >= commit_ended
        assert len(chunks[-1].output_ids) == _TOKENS
        assert _count(service.metrics.batches_ahead) == 1
        assert _count(service.metrics.batches_voided) == 0
        settled = ledger.find_request(ledger_rid("ada", "r1"))
        assert settled is not None and joined.clearance is not None
        assert (settled.batch_id, settled.status) == (joined.clearance.batch_id, "served")
        assert ledger.balance("ada").held_micros == 0
        assert ledger.reconcile().ok


@pytest.mark.anyio
async def test_a_batch_its_commit_cannot_settle_whole_is_cancelled_and_cleared_again(
    ledger_db: MigratedDatabase, monkeypatch: pytest.MonkeyPatch
) -> None:
    await _voided(ledger_db, monkeypatch)


async def _voided(db: MigratedDatabase, monkeypatch: pytest.MonkeyPatch) -> None:
    async with running_service(db) as service:
        ledger = service.ledger
        await _known(service, "ada", "bob")
        bob_before = ledger.balance("bob").balance_micros
        # Another replica spends ada's budget after the server last heard of it.
        elsewhere = _spend_elsewhere(ledger, "ada")
        commits = _Commits(ledger, monkeypatch, delay=0.2)
        started = _ttft(service, "_count")

        outcomes = await asyncio.gather(
            _admit(service, "ada", "a1", 5_000),
            _admit(service, "bob", "b1", 4_000),
            return_exceptions=True,
        )
        assert isinstance(outcomes[0], PaymentRequired)
        bob = outcomes[1]
        assert isinstance(bob, Ticket)
        clearance = await bob.wait_cleared()
        chunks = await _chunks(bob)

        assert _count(service.metrics.batches_ahead) == 1
        assert _count(service.metrics.batches_voided) == 1
        assert len(commits.ended) == 2  # the void one (its holds), then bob's own batch
        # Both went to the engine ahead and started there; bob then started once more.
        assert _ttft(service, "_count") == started + 3
        # Cleared again without ada, and sent again under a rid of its own.
        assert clearance.batch_size == 1
        assert bob.engine_rid == ledger_rid("bob", "b1") + "~1"
        # Only the second attempt's output: cumulative chunks, each extending the last.
        outputs = [chunk.output_ids for chunk in chunks]
        assert all(later[: len(earlier)] == earlier for earlier, later in pairwise(outputs))
        assert len(outputs[-1]) == _TOKENS
        settled = ledger.find_request(ledger_rid("bob", "b1"))
        assert settled is not None
        assert (settled.batch_id, settled.status) == (clearance.batch_id, "served")
        # Charged once, for the batch it was served in.
        charge = clearance.user_batch_charge_micros
        assert ledger.balance("bob").balance_micros == bob_before - charge
        assert ledger.balance("bob").held_micros == 0
        assert ledger.balance("ada").held_micros == elsewhere  # only the other replica's hold
        assert service.load().inflight == 0
        assert ledger.reconcile().ok
        # ada, refused, waits for commits for a while (she can afford 500 again); bob does not.
        await _served(service, "ada", "a2", 500)
        assert _count(service.metrics.batches_ahead) == 1
        await _served(service, "bob", "b2", 4_000)
        assert _count(service.metrics.batches_ahead) == 2


@pytest.mark.anyio
async def test_a_failed_commit_leaves_a_batch_sent_ahead_uncharged_and_stopped(
    ledger_db: MigratedDatabase, monkeypatch: pytest.MonkeyPatch
) -> None:
    await _failed_commit(ledger_db, monkeypatch)


async def _failed_commit(db: MigratedDatabase, monkeypatch: pytest.MonkeyPatch) -> None:
    async with running_service(db) as service:
        ledger = service.ledger
        await _known(service, "ada")
        before = ledger.balance("ada")
        _Commits(ledger, monkeypatch, delay=0.1, failures=1)

        with pytest.raises(Unavailable):
            await _admit(service, "ada", "r1", 5_000)
        for _ in range(100):  # the cancelled generation leaves the engine
            if service.load().inflight == 0:
                break
            await asyncio.sleep(0.01)

        assert _count(service.metrics.batches_ahead) == 1
        assert service.load().inflight == 0
        after = ledger.balance("ada")
        assert (after.balance_micros, after.held_micros) == (before.balance_micros, 0)
        assert ledger.reconcile().ok
        # The rid was never charged: sent again, it is admitted afresh and served.
        ticket = await _served(service, "ada", "r1", 5_000)
        assert ticket.clearance is not None
        assert ledger.reconcile().ok


@pytest.mark.anyio
async def test_a_user_whose_request_could_not_be_claimed_waits_for_commits(
    ledger_db: MigratedDatabase,
) -> None:
    await _distrusted(ledger_db)


async def _distrusted(db: MigratedDatabase) -> None:
    async with running_service(db) as service:
        ledger = service.ledger
        await _known(service, "ada", "bob")
        # Another replica holds ada's rid r1 for another payload.
        [other] = ledger.place_holds([HoldInput("ada", ledger_rid("ada", "r1"), 9_000, "f" * 64)])
        assert other.state is HoldState.OPEN

        outcomes = await asyncio.gather(
            _admit(service, "ada", "r1", 5_000),
            _admit(service, "bob", "b1", 4_000),
            return_exceptions=True,
        )
        assert isinstance(outcomes[0], Conflict)
        assert isinstance(outcomes[1], Ticket)
        await outcomes[1].result()
        assert _count(service.metrics.batches_voided) == 1
        ahead = _count(service.metrics.batches_ahead)

        await _served(service, "ada", "r2", 5_000)  # ada: after its commit, for a while
        assert _count(service.metrics.batches_ahead) == ahead
        await _served(service, "bob", "b2", 4_000)  # bob is not held to account for ada
        assert _count(service.metrics.batches_ahead) == ahead + 1
        assert ledger.balance("ada").held_micros == 9_000  # the other replica's, untouched
        assert ledger.reconcile().ok


@pytest.mark.anyio
async def test_a_void_batch_drops_what_the_prefix_deferral_still_held_back(
    ledger_db: MigratedDatabase, monkeypatch: pytest.MonkeyPatch
) -> None:
    await _voided_with_deferral(ledger_db, monkeypatch)


async def _voided_with_deferral(db: MigratedDatabase, monkeypatch: pytest.MonkeyPatch) -> None:
    async with running_service(db) as service:
        ledger = service.ledger
        await _known(service, "ada", "bob")
        _spend_elsewhere(ledger, "ada")
        _Commits(ledger, monkeypatch, delay=0.2)
        held_before = _count(service.metrics.deferral_held)
        article = list(range(100, 400))  # 300 shared tokens: siblings wait for the first

        outcomes = await asyncio.gather(
            _admit(service, "ada", "a1", 5_000),
            *(_admit(service, "bob", f"b{i}", 4_000, prompt=[*article, i]) for i in range(3)),
            return_exceptions=True,
        )
        assert isinstance(outcomes[0], PaymentRequired)
        tickets = [o for o in outcomes[1:] if isinstance(o, Ticket)]
        assert len(tickets) == 3
        results = [await ticket.result() for ticket in tickets]

        assert _count(service.metrics.batches_voided) == 1
        # Held back in the void batch, then again in the batch cleared after it.
        assert _count(service.metrics.deferral_held) == held_before + 4
        assert all(len(result.output_ids) == _TOKENS for result in results)
        assert {t.clearance.batch_size for t in tickets if t.clearance} == {3}
        # Nothing is left counted at the engine: those never sent are no longer in flight.
        assert service.load().inflight == 0
        assert ledger.balance("bob").held_micros == 0
        assert ledger.reconcile().ok
