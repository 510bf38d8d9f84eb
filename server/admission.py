"""Admission's ledger side: a request's hold, placed, re-opened or released.

A request id is the client's idempotency key. The hold stores the payload's fingerprint, so a
retry is recognised even after a restart: the same payload joins the request (or, when its hold
was released because it never reached a batch, is admitted afresh), another payload is a 409.
Errors name the client's rid, never the ledger's internal `user/rid`.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
from typing import Any

from inference_auctions.billing import (
    HoldInput,
    HoldState,
    HoldView,
    Ledger,
    LedgerError,
    LedgerUnavailable,
    hold_micros,
)
from inference_auctions.billing import IdempotencyConflict as LedgerConflict
from inference_auctions.server.errors import Conflict, ServiceError, Unavailable, from_ledger_error
from inference_auctions.server.ledger_writer import LedgerWriter
from inference_auctions.server.metrics import Metrics
from inference_auctions.server.tickets import Ticket

log = logging.getLogger(__name__)


# The canonical form of a payload: what `json.dumps(payload, sort_keys=True,
# separators=(",", ":"), default=str)` writes (holds store its digest, so it must never
# change), with one encoder for every request instead of one built per call.
_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), default=str)


def payload_fingerprint(payload: dict[str, Any]) -> str:
    """A stable digest of a request's payload (what a retry must repeat exactly)."""
    return hashlib.sha256(_CANONICAL.encode(payload).encode()).hexdigest()


def ledger_rid(user: str, rid: str) -> str:
    """The ledger's (and the engine's) id of a client's request: unique across users."""
    return f"{user}/{rid}"


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
