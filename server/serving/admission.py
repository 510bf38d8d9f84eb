"""Admission: a request's hold, placed, re-opened or released, and the memory its answer takes.

A request id is the client's idempotency key. The hold stores the payload's fingerprint, so a
retry is recognised even after a restart: the same payload joins the request (or, when its hold
was released because it never reached a batch, is admitted afresh), another payload is a 409.
Errors name the client's rid, never the ledger's internal `user/rid`.

`AnswerMemory`: the server-wide memory budget for answers, in flight and kept for retries.

An admitted request reserves the most its answer can hold in this process (`max_new_tokens`
times `RESERVED_BYTES_PER_TOKEN`: its cumulative text, its ids as Python ints, and the copy
being rendered for its client) until it ends. A finished answer is kept for retries of its rid
and counted at its real size (`KEPT_BYTES_PER_TOKEN` per token) until it is dropped; kept
answers are dropped, oldest first, to make room for a new request, and only when what is in
flight fills the budget is a request refused: 503 with Retry-After, before any money moves.
A flood of long answers, free or not, thus makes the server refuse work, never run out of
memory.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from inference_auctions.billing import (
    HoldInput,
    HoldState,
    HoldView,
    Ledger,
    LedgerError,
    LedgerUnavailable,
    hold_micros,
    request_key,
)
from inference_auctions.billing import IdempotencyConflict as LedgerConflict
from inference_auctions.server.engine.protocol import DEFAULT_MAX_NEW_TOKENS, TokenIds
from inference_auctions.server.errors import Conflict, ServiceError, Unavailable, from_ledger_error
from inference_auctions.server.ledger_writer.writer import LedgerWriter
from inference_auctions.server.metrics import Metrics
from inference_auctions.server.serving.tickets import Ticket

__all__ = [
    "KEPT_BYTES_PER_TOKEN",
    "RESERVED_BYTES_PER_TOKEN",
    "Admission",
    "Admissions",
    "AnswerMemory",
    "conflict",
    "held",
    "hold_was_placed",
    "ledger_rid",
    "payload_fingerprint",
    "queue_hold",
    "release_hold",
    "unavailable",
]

log = logging.getLogger(__name__)


# The canonical form of a payload: what `json.dumps(payload, sort_keys=True,
# separators=(",", ":"), default=str)` writes (holds store its digest, so it must never
# change), with one encoder for every request instead of one built per call.
_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), default=str)


def payload_fingerprint(payload: dict[str, Any]) -> str:
    """A stable digest of a request's payload (what a retry must repeat exactly)."""
    return hashlib.sha256(_CANONICAL.encode(payload).encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class Admission:
    """A validated generation request, as a route hands it to the service: whose, its rid
    (the client's idempotency key), its prompt, its bid once parsed, what the engine is asked
    for, the fingerprint a retry must repeat, and whether its client reads it as a stream."""

    user: str
    rid: str
    tokens: TokenIds
    bid_micros: int
    sampling_params: dict[str, Any]
    fingerprint: str
    streamed: bool = True


def ledger_rid(user: str, rid: str) -> str:
    """The ledger's (and the engine's) id of a client's request (`billing.request_key`)."""
    return request_key(user, rid)


def conflict(rid: str) -> ServiceError:
    """The 409 for a rid reused with another payload."""
    return Conflict(
        f"request id {rid!r} was already used with a different payload; use a new rid for a "
        "new request",
        param="rid",
    )


def unavailable(message: str) -> ServiceError:
    """A 503 the client should retry after a second."""
    return Unavailable(message, headers={"Retry-After": "1"})


def queue_hold(writer: LedgerWriter, ticket: Ticket) -> asyncio.Future[HoldView]:
    """Queue the ticket's hold of its bid and request fee (re-opening a released hold of the
    same payload) for the writer's next group commit; `held` tells its outcome."""
    amount = hold_micros(ticket.bid_micros, ticket.fee_micros)  # the bid and the request fee
    request = HoldInput(ticket.user, ticket.ledger_rid, amount, ticket.fingerprint)
    return writer.queue_hold(request)


async def held(placing: asyncio.Future[HoldView], metrics: Metrics, ticket: Ticket) -> None:
    """Wait for the ticket's hold; raise the client's error if it was not placed."""
    try:
        hold = await asyncio.shield(placing)  # a cancelled handler leaves the outcome to others
    except LedgerConflict:
        raise conflict(ticket.rid) from None
    except LedgerUnavailable as error:  # down or locked: nothing was written
        metrics.ledger_errors.labels(operation="hold").inc()
        log.warning("placing a hold failed: %s", error)
        raise unavailable("the ledger is unavailable; retry shortly") from None
    except LedgerError as error:
        raise from_ledger_error(error, ticket.fee_micros) from None
    except Exception as error:  # the database is down or locked: nothing was written
        metrics.ledger_errors.labels(operation="hold").inc()
        log.warning("placing a hold failed: %s", error)
        raise unavailable("the ledger is unavailable; retry shortly") from None
    if hold.state is HoldState.SETTLED:
        # Settled in an earlier batch (before a restart, or by another replica): its answer is
        # not here to replay.
        raise Conflict(
            f"request id {ticket.rid!r} was already settled in batch {hold.batch_id}; "
            "use a new rid for a new request",
            param="rid",
        )


async def hold_was_placed(ticket: Ticket) -> bool:
    """Whether the ticket's hold is in the ledger (waiting for its commit if need be)."""
    if ticket.hold is None:
        return False
    try:
        hold = await asyncio.shield(ticket.hold)
    except Exception:
        return False
    return hold.state is HoldState.OPEN


async def release_hold(
    writer: LedgerWriter, ledger: Ledger, metrics: Metrics, ticket: Ticket, reason: str
) -> None:
    """Free the ticket's hold; a failure is left to the stale-hold job."""
    try:
        await writer.call(ledger.release, ticket.ledger_rid, reason)
    except Exception as error:
        metrics.ledger_errors.labels(operation="release").inc()
        log.warning("releasing the hold of %r failed: %s", ticket.rid, error)


# Finished tickets kept for idempotent retries; older ones fall back to the ledger's record.
REMEMBERED_TICKETS = 10_000


class Admissions:
    """The admitted requests known by their rid, and their holds: what the service, a batch's
    closing and the answer-memory budget share about them.

    A retry of a remembered rid joins its ticket; a forgotten one is admitted afresh (its hold
    re-opened by the ledger). The most recent `remembered` finished tickets are kept."""

    def __init__(
        self,
        writer: LedgerWriter,
        ledger: Ledger,
        metrics: Metrics,
        remembered: int = REMEMBERED_TICKETS,
    ) -> None:
        self._writer = writer
        self._ledger = ledger
        self._metrics = metrics
        self._remembered = remembered
        self._tickets: OrderedDict[tuple[str, str], Ticket] = OrderedDict()

    def known(self, user: str, rid: str) -> Ticket | None:
        """The ticket of a rid admitted before and not forgotten."""
        return self._tickets.get((user, rid))

    def remember(self, ticket: Ticket) -> None:
        """Known from now on: a retry of its rid joins it."""
        self._tickets[(ticket.user, ticket.rid)] = ticket
        while len(self._tickets) > self._remembered:
            oldest_key, oldest = next(iter(self._tickets.items()))
            if not oldest.done:
                break
            del self._tickets[oldest_key]

    def forget(self, ticket: Ticket) -> None:
        """A retry of the ticket's rid is admitted afresh."""
        self._tickets.pop((ticket.user, ticket.rid), None)

    def forget_if_current(self, ticket: Ticket) -> None:
        """Forget the ticket unless a newer one of its rid took its place."""
        if self._tickets.get((ticket.user, ticket.rid)) is ticket:
            del self._tickets[(ticket.user, ticket.rid)]

    async def release(self, ticket: Ticket, reason: str) -> None:
        """Free the ticket's hold (placed)."""
        await release_hold(self._writer, self._ledger, self._metrics, ticket, reason)

    async def release_when_placed(self, ticket: Ticket, reason: str) -> None:
        """Free the ticket's hold once its commit is known, if it was placed."""
        if await hold_was_placed(ticket):
            await self.release(ticket, reason)


# Measured in tests/security/test_answer_memory.py: an answer of n tokens held by the server
# costs about 60 bytes a token while it streams; reserved with room to spare.
RESERVED_BYTES_PER_TOKEN = 128
KEPT_BYTES_PER_TOKEN = 64
PROMPT_BYTES_PER_TOKEN = 8  # the prompt's ids (int32) and its place in the tokenizer cache


class AnswerMemory:
    """Reservations of answers in flight and the answers kept, within `limit_bytes`;
    `forget(ticket)` drops a kept answer's ticket from the retry table."""

    def __init__(self, limit_bytes: int, forget: Callable[[Ticket], None]) -> None:
        self.limit_bytes = limit_bytes
        self.used_bytes = 0
        self._forget = forget
        self._kept: deque[tuple[Ticket, int]] = deque()

    def reserve(self, ticket: Ticket, max_new_tokens_limit: int) -> None:
        """Reserve the ticket's answer, released when it finishes; 503 if it cannot fit."""
        need = self._reservation(ticket, max_new_tokens_limit)
        while self.used_bytes + need > self.limit_bytes and self._kept:
            kept, size = self._kept.popleft()
            self.used_bytes -= size
            self._forget(kept)
        if self.used_bytes + need > self.limit_bytes:
            mib = self.limit_bytes / 2**20
            raise unavailable(
                f"answers in flight fill the server's memory budget for answers ({mib:,.0f} "
                "MiB, answer_memory_mib); retry shortly, or ask for fewer max_new_tokens"
            )
        self.used_bytes += need
        ticket.on_finish.append(lambda: self._finished(ticket, need))

    def _finished(self, ticket: Ticket, reserved: int) -> None:
        self.used_bytes -= reserved
        chunk = ticket.last_chunk
        if chunk is None or ticket.error is not None:
            return
        size = len(chunk.output_ids) * KEPT_BYTES_PER_TOKEN + len(chunk.text)
        self.used_bytes += size
        self._kept.append((ticket, size))

    @staticmethod
    def _reservation(ticket: Ticket, max_new_tokens_limit: int) -> int:
        asked: Any = ticket.sampling_params.get("max_new_tokens", DEFAULT_MAX_NEW_TOKENS)
        tokens = asked if isinstance(asked, int) and asked >= 0 else max_new_tokens_limit
        return tokens * RESERVED_BYTES_PER_TOKEN + len(ticket.tokens) * PROMPT_BYTES_PER_TOKEN
