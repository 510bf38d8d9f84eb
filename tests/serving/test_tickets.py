"""A ticket's readers: each wakes at the change it waits for, and one that gives up (cancelled,
or its client gone) neither wakes nor blocks the others."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest

from inference_auctions.server.api.connections import DISCONNECT_NOTICE, DisconnectNotice
from inference_auctions.server.api.generation import complete
from inference_auctions.server.errors import ServiceError, Unavailable
from inference_auctions.server.serving.tickets import Chunk, Clearance, Ticket

CLEARANCE = Clearance("b1", 0, 1, 1.0, 100, 10, 10, 0)


def _ticket() -> Ticket:
    tokens = np.zeros(3, dtype=np.int32)
    return Ticket("ann", "r1", "ann/r1", tokens, 100, {}, "fingerprint")


def _chunk(text: str) -> Chunk:
    return Chunk(text, [len(text)], {"finish_reason": None})


async def _settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


@pytest.mark.anyio
async def test_follow_yields_every_chunk_in_order_from_the_first() -> None:
    # A reader a few chunks behind reads each; one far behind skips to the latest, which holds
    # all it missed (chunks are cumulative: memory linear in the answer, not quadratic).
    async def scenario() -> list[str]:
        ticket = _ticket()
        ticket.push(_chunk("a"))  # before anyone follows
        seen: list[str] = []

        async def reader() -> None:
            async for chunk in ticket.follow():
                seen.append(chunk.text)

        task = asyncio.create_task(reader())
        await _settle()
        ticket.push(_chunk("ab"))
        ticket.push(_chunk("abc"))  # two pushes before the reader runs again
        await _settle()
        ticket.push(_chunk("abcd"))
        await ticket.finish()
        await asyncio.wait_for(task, 1)
        return seen

    assert await scenario() == ["a", "ab", "abc", "abcd"]


@pytest.mark.anyio
async def test_result_is_the_last_chunk_or_the_error_or_no_output() -> None:
    served = _ticket()
    waiting = asyncio.create_task(served.result())
    await _settle()
    served.push(_chunk("a"))
    await _settle()
    assert not waiting.done()  # a chunk is not the end
    served.push(_chunk("ab"))
    await served.finish()
    assert (await asyncio.wait_for(waiting, 1)).text == "ab"

    failed = _ticket()
    failed.push(_chunk("a"))
    await failed.finish(ServiceError("engine down"))
    with pytest.raises(ServiceError, match="engine down"):
        await failed.result()

    empty = _ticket()
    await empty.finish()
    with pytest.raises(ServiceError, match="no output"):
        await empty.result()


@pytest.mark.anyio
async def test_a_cancelled_reader_leaves_the_others_waiting_and_woken() -> None:
    ticket = _ticket()
    quitter = asyncio.create_task(ticket.wait_cleared())
    stayer = asyncio.create_task(ticket.wait_cleared())
    ended = asyncio.create_task(ticket.result())
    await _settle()
    quitter.cancel()
    await _settle()
    assert not stayer.done() and not ended.done()
    await ticket.clear(CLEARANCE)
    assert await asyncio.wait_for(stayer, 1) == CLEARANCE
    assert not ended.done()
    await ticket.finish(ServiceError("gone"))
    with pytest.raises(ServiceError):
        await asyncio.wait_for(ended, 1)
    assert quitter.cancelled()
    # A reader that comes after the clearance gets it at once.
    assert await asyncio.wait_for(ticket.wait_cleared(), 1) == CLEARANCE


@pytest.mark.anyio
async def test_wait_cleared_raises_the_error_of_a_request_that_ended_uncleared() -> None:
    ticket = _ticket()
    waiting = asyncio.create_task(ticket.wait_cleared())
    await _settle()
    await ticket.finish(Unavailable("not queued"))
    with pytest.raises(Unavailable, match="not queued"):
        await asyncio.wait_for(waiting, 1)


class _Connection:
    """An ASGI `receive` whose client leaves when told to (an ASGI server other than the
    auction server's own: the handler reads `receive` until the disconnect)."""

    def __init__(self) -> None:
        self.scope: dict[str, Any] = {}
        self.left = asyncio.Event()
        self.receiving = 0

    async def receive(self) -> dict[str, Any]:
        self.receiving += 1
        await self.left.wait()
        return {"type": "http.disconnect"}

    def leave(self) -> None:
        self.left.set()


class _NoticedConnection(_Connection):
    """The auction server's own protocol: the connection tells the handler it is lost
    (`DisconnectNotice`), and nothing reads `receive`."""

    def __init__(self) -> None:
        super().__init__()
        self.notice = DisconnectNotice()
        self.scope = {"extensions": {DISCONNECT_NOTICE: {"notice": self.notice}}}

    def leave(self) -> None:
        self.notice.connection_lost()


CONNECTIONS = [_Connection, _NoticedConnection]


class _Service:
    def __init__(self) -> None:
        self.abandoned: list[Ticket] = []

    async def abandon(self, ticket: Ticket) -> None:
        self.abandoned.append(ticket)


@pytest.mark.anyio
@pytest.mark.parametrize("connected", CONNECTIONS)
async def test_a_client_that_leaves_before_clearance_abandons_its_ticket(
    connected: type[_Connection],
) -> None:
    ticket, connection, service = _ticket(), connected(), _Service()
    handler = asyncio.create_task(complete(connection, service, ticket))  # type: ignore[arg-type]
    await _settle()
    # Read until the disconnect only where the connection cannot say it itself.
    assert connection.receiving == (0 if connected is _NoticedConnection else 1)
    connection.leave()
    with pytest.raises(Unavailable, match="disconnected before its batch closed"):
        await asyncio.wait_for(handler, 1)
    assert service.abandoned == [ticket]
    assert ticket.waiters == 0


@pytest.mark.anyio
@pytest.mark.parametrize("connected", CONNECTIONS)
async def test_a_client_that_stays_gets_its_answer_and_its_watch_ends(
    connected: type[_Connection],
) -> None:
    runner = asyncio.all_tasks() - {asyncio.current_task()}  # the test runner's own
    ticket, connection, service = _ticket(), connected(), _Service()
    handler = asyncio.create_task(complete(connection, service, ticket))  # type: ignore[arg-type]
    await _settle()
    await ticket.clear(CLEARANCE)
    ticket.push(_chunk("done"))
    await ticket.finish()
    clearance, final = await asyncio.wait_for(handler, 1)
    assert (clearance, final.text) == (CLEARANCE, "done")
    await _settle()
    assert asyncio.all_tasks() - runner == {asyncio.current_task()}  # its watch ended too
    connection.leave()  # leaving afterwards changes nothing
    await _settle()
    assert service.abandoned == []


@pytest.mark.anyio
@pytest.mark.parametrize("connected", CONNECTIONS)
async def test_a_retry_that_leaves_does_not_abandon_the_request_another_handler_waits_for(
    connected: type[_Connection],
) -> None:
    ticket, service = _ticket(), _Service()
    first, retry = connected(), connected()
    staying = asyncio.create_task(complete(first, service, ticket))  # type: ignore[arg-type]
    leaving = asyncio.create_task(complete(retry, service, ticket))  # type: ignore[arg-type]
    await _settle()
    retry.leave()
    with pytest.raises(Unavailable):
        await asyncio.wait_for(leaving, 1)
    assert service.abandoned == []
    await ticket.clear(CLEARANCE)
    ticket.push(_chunk("x"))
    await ticket.finish()
    assert (await asyncio.wait_for(staying, 1))[1].text == "x"


@pytest.mark.anyio
@pytest.mark.parametrize("connected", CONNECTIONS)
async def test_a_cancelled_handler_abandons_nothing_and_stops_watching(
    connected: type[_Connection],
) -> None:
    runner = asyncio.all_tasks() - {asyncio.current_task()}  # the test runner's own
    ticket, connection, service = _ticket(), connected(), _Service()
    handler = asyncio.create_task(complete(connection, service, ticket))  # type: ignore[arg-type]
    await _settle()
    handler.cancel()
    with pytest.raises(asyncio.CancelledError):
        await handler
    await _settle()
    assert asyncio.all_tasks() - runner == {asyncio.current_task()}  # nothing left waiting
    assert service.abandoned == [] and ticket.waiters == 0
    await ticket.clear(CLEARANCE)  # later readers are unaffected
    assert await asyncio.wait_for(ticket.wait_cleared(), 1) == CLEARANCE
