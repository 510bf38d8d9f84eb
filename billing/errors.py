"""Errors raised by the ledger. Every message names the user, request or field at fault.

LedgerError
 ├── InvalidInput               a field is malformed (names the field)
 │    ├── InvalidAmount         money that is negative, fractional, too precise or too large
 │    └── InvalidBatch          a batch to settle is inconsistent (names the batch)
 ├── UnknownUser                no user has that name
 ├── DuplicateUser              the name is taken
 ├── UnknownApiKey              the user has no unrevoked key of that name
 ├── DuplicateApiKey            the user already has an unrevoked key of that name
 ├── UserDisabled               the user may not place new holds
 ├── UnknownRequest             no hold (or no settlement) for that request id
 ├── UnknownBatch               no batch with that id was settled
 ├── InsufficientFunds          available < requested
 ├── BatchCapExceeded           the user's per-batch cap would be exceeded
 ├── HoldNotOpen                the hold was already released or settled
 ├── RequestNotScheduled        a request's outcome was already recorded (served or failed)
 ├── ChargeExceedsHold          a charge is larger than what the user held in the batch
 ├── RefundExceedsCharge        a refund is larger than what is left of the charge
 ├── IdempotencyConflict        a replay of an operation carries different values
 ├── RuleDisagreement           another live replica on the ledger clears under another rule
 └── LedgerUnavailable          the database is down, locked past its timeout or out of
                                connections; nothing was written, retry shortly

A refused operation leaves the ledger unchanged: validation happens before any write.
"""

# the names are the ledger's public API: InsufficientFunds, not ...Error

from __future__ import annotations

import math
from datetime import UTC, datetime


class LedgerError(Exception):
    """Base class of every error the ledger raises on purpose."""

    def __init__(self, message: str) -> None:
        self.message = message
        super().__init__(message)


class InvalidInput(LedgerError):
    """A field is malformed."""

    def __init__(self, field: str, problem: str) -> None:
        self.field = field
        self.problem = problem
        super().__init__(f"{field}: {problem}")


class InvalidAmount(InvalidInput):
    """An amount of money is not a valid integer number of micro-credits (or credits)."""


class InvalidBatch(InvalidInput):
    """A batch handed to `settle_batch` contradicts itself or the holds."""

    def __init__(self, batch_id: str, problem: str) -> None:
        self.batch_id = batch_id
        super().__init__(f"batch {batch_id!r}", problem)


class UnknownUser(LedgerError):
    """No user has that name."""

    def __init__(self, name: str) -> None:
        self.name = name
        super().__init__(f"unknown user {name!r}")


class DuplicateUser(LedgerError):
    """A user with that name already exists."""

    def __init__(self, name: str) -> None:
        self.name = name
        super().__init__(f"user {name!r} already exists")


class UnknownApiKey(LedgerError):
    """The user has no usable (unrevoked) API key of that name."""

    def __init__(self, user: str, key_name: str) -> None:
        self.name = user
        self.key_name = key_name
        super().__init__(f"user {user!r} has no API key named {key_name!r}")


class DuplicateApiKey(LedgerError):
    """The user already has an unrevoked API key of that name."""

    def __init__(self, user: str, key_name: str) -> None:
        self.name = user
        self.key_name = key_name
        super().__init__(f"user {user!r} already has an API key named {key_name!r}")


class UserDisabled(LedgerError):
    """The user is disabled and may not place holds."""

    def __init__(self, name: str) -> None:
        self.name = name
        super().__init__(f"user {name!r} is disabled")


class UnknownRequest(LedgerError):
    """The ledger knows no hold (or no settlement) for the request id."""

    def __init__(self, rid: str, detail: str = "no hold was placed for it") -> None:
        self.rid = rid
        super().__init__(f"unknown request {rid!r}: {detail}")


class UnknownBatch(LedgerError):
    """No batch with that id was settled."""

    def __init__(self, batch_id: str) -> None:
        self.batch_id = batch_id
        super().__init__(f"no batch {batch_id!r} was settled")


class InsufficientFunds(LedgerError):
    """The user's available funds do not cover the amount; `renews_at`: when the budget's
    period ends and its next grant comes (None for a lifetime budget)."""

    def __init__(
        self,
        name: str,
        available_micros: int,
        requested_micros: int,
        renews_at: datetime | None = None,
    ) -> None:
        self.name = name
        self.available_micros = available_micros
        self.requested_micros = requested_micros
        self.renews_at = renews_at
        super().__init__(
            f"user {name!r} has {available_micros} micro-credits available,"
            f" {requested_micros} requested"
        )


class BatchCapExceeded(LedgerError):
    """The user's open holds would exceed the user's per-batch cap."""

    def __init__(self, name: str, cap_micros: int, held_micros: int, requested_micros: int) -> None:
        self.name = name
        self.cap_micros = cap_micros
        self.held_micros = held_micros
        self.requested_micros = requested_micros
        super().__init__(
            f"user {name!r} has a cap of {cap_micros} micro-credits per batch;"
            f" {held_micros} already held, {requested_micros} requested"
        )


class HoldNotOpen(LedgerError):
    """The hold of the request was already released or settled."""

    def __init__(self, rid: str, state: str) -> None:
        self.rid = rid
        self.state = state
        super().__init__(f"the hold of request {rid!r} is {state}, not open")


class RequestNotScheduled(LedgerError):
    """A request's outcome was already recorded: served, or failed (by recovery, say)."""

    def __init__(self, rid: str, status: str) -> None:
        self.rid = rid
        self.status = status
        super().__init__(f"request {rid!r} is already {status}")


class ChargeExceedsHold(LedgerError):
    """A user's charge in a batch is larger than what the user held for that batch."""

    def __init__(self, batch_id: str, name: str, charge_micros: int, held_micros: int) -> None:
        self.batch_id = batch_id
        self.name = name
        self.charge_micros = charge_micros
        self.held_micros = held_micros
        super().__init__(
            f"batch {batch_id!r}: charge of {charge_micros} micro-credits to user {name!r}"
            f" exceeds the {held_micros} held for its requests"
        )


class RefundExceedsCharge(LedgerError):
    """A refund is larger than what is left of the user's charge in the batch."""

    def __init__(
        self, batch_id: str, name: str, requested_micros: int, refundable_micros: int
    ) -> None:
        self.batch_id = batch_id
        self.name = name
        self.requested_micros = requested_micros
        self.refundable_micros = refundable_micros
        super().__init__(
            f"batch {batch_id!r}: refund of {requested_micros} micro-credits to user {name!r}"
            f" exceeds the {refundable_micros} left of the charge"
        )


class IdempotencyConflict(LedgerError):
    """An operation was replayed under the same key with different values."""

    def __init__(self, key: str, detail: str) -> None:
        self.key = key
        self.detail = detail
        super().__init__(f"{key!r} was already recorded with different values: {detail}")


class LedgerUnavailable(LedgerError):
    """The database is unreachable, locked past its timeout or out of connections.

    The transaction did not commit, so nothing was written; the same call may succeed later.
    """

    def __init__(self, cause: str) -> None:
        self.cause = cause
        super().__init__("the ledger is unavailable; retry shortly")


class RuleDisagreement(LedgerError):
    """Another server process on the same ledger, seen lately, clears its batches under
    another pricing mode, tiers, pricing rule or request fee: replicas must price every batch
    alike. It may be live, or it may have crashed: its row binds until `allowed_at`, once the
    liveness window has passed since its last heartbeat."""

    def __init__(
        self,
        replica: str,
        theirs: str,
        ours: str,
        *,
        process: str,
        seen_at: datetime,
        allowed_at: datetime,
        now: datetime,
    ) -> None:
        self.replica = replica
        self.theirs = theirs
        self.ours = ours
        self.allowed_at = allowed_at
        seen = max(0, round((now - seen_at).total_seconds()))
        wait = max(1, math.ceil((allowed_at - now).total_seconds()))
        super().__init__(
            f"replica {replica!r} on this ledger clears under {theirs}, this one under {ours}:"
            " every replica sharing a ledger must use the same pricing mode (and tiers),"
            " pricing_rule, priority_slots and request_fee_micros. If it runs, start this one"
            " with the same settings, or stop every replica before changing them. It is"
            f" {process}, last seen {seen} s ago; if it is not running any more (it crashed),"
            " its heartbeat lapses and this start is allowed from"
            f" {allowed_at.astimezone(UTC):%H:%M:%S} UTC, in {wait} s"
        )
