"""Errors the HTTP API returns, and the one place that renders them.

    ServiceError (status, type, message, param)
     ├── InvalidRequest          400  bad JSON, a bad field, a limit exceeded
     │    └── ClientGone         400  the client left mid-body (nobody reads the answer)
     ├── Unauthenticated         401  missing or unknown API key
     ├── PaymentRequired         402  the budget cannot cover the bid
     ├── Forbidden               403  a user key on an admin route, a disabled account
     ├── NotFound                404
     │    └── ModelNotFound      404  an OpenAI request names a model this server does not serve
     ├── Conflict                409  a rid reused with another payload, a name taken
     ├── RateLimited             429  with Retry-After
     ├── EngineFailed            502  the engine errored, refused or cut the stream
     ├── Unavailable             503  shutting down, the queue is full or the ledger is down
     └── EngineTimedOut          504

Every error body is `{"error": {"type": ..., "message": ..., "param": ..., "code": ...}}`, with
`code` the one OpenAI sends for the same failure where it has one (`invalid_api_key`,
`rate_limit_exceeded`, `insufficient_quota`...), so OpenAI's clients and tools read it.
Services raise these (or ledger errors, mapped by `from_ledger_error`);
`server.api.error_handlers` renders them, and routes never build error responses themselves.
"""

from __future__ import annotations

from datetime import UTC
from typing import Any

from inference_auctions import billing


class ServiceError(Exception):
    """An error with an HTTP status, a machine-readable type and a message for people."""

    status_code = 500
    error_type = "internal_error"
    # OpenAI's `code` for the failure (its clients branch on it); our own name where it has none.
    code = "internal_error"

    def __init__(
        self, message: str, *, param: str | None = None, headers: dict[str, str] | None = None
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        """The JSON body of the response."""
        return {
            "error": {
                "type": self.error_type,
                "message": self.message,
                "param": self.param,
                "code": self.code,
            }
        }


class InvalidRequest(ServiceError):
    status_code, error_type = 400, "invalid_request"
    code = "invalid_value"


class ClientGone(InvalidRequest):
    error_type = "client_disconnected"
    code = "client_disconnected"


class Unauthenticated(ServiceError):
    status_code, error_type = 401, "unauthenticated"
    code = "invalid_api_key"


class PaymentRequired(ServiceError):
    status_code, error_type = 402, "insufficient_funds"
    code = "insufficient_quota"


class Forbidden(ServiceError):
    status_code, error_type = 403, "forbidden"
    code = "permission_denied"


class NotFound(ServiceError):
    status_code, error_type = 404, "not_found"
    code = "not_found"


class ModelNotFound(NotFound):
    error_type = "model_not_found"  # OpenAI's code for the same mistake
    code = "model_not_found"


class Conflict(ServiceError):
    status_code, error_type = 409, "idempotency_conflict"
    code = "idempotency_conflict"


class RateLimited(ServiceError):
    status_code, error_type = 429, "rate_limited"
    code = "rate_limit_exceeded"


class EngineFailed(ServiceError):
    status_code, error_type = 502, "engine_error"
    code = "engine_error"


class Unavailable(ServiceError):
    status_code, error_type = 503, "unavailable"
    code = "service_unavailable"


class EngineTimedOut(ServiceError):
    status_code, error_type = 504, "engine_timeout"
    code = "engine_timeout"


def from_ledger_error(error: billing.LedgerError, fee_micros: int = 0) -> ServiceError:
    """Map a refused ledger operation to the HTTP error a client should see; `fee_micros`:
    the request fee held with the bid, named in a 402."""
    message = str(error)
    if isinstance(error, billing.LedgerUnavailable):
        return Unavailable(message, headers={"Retry-After": "1"})
    if isinstance(error, billing.InsufficientFunds):
        return PaymentRequired(_insufficient_funds(error, fee_micros), param="bid")
    if isinstance(error, billing.BatchCapExceeded):
        return PaymentRequired(_over_batch_cap(error, fee_micros), param="bid")
    for named in (getattr(error, "rid", None), getattr(error, "key", None)):
        if isinstance(named, str):  # the ledger's request key: the client knows its own rid
            message = message.replace(repr(named), repr(billing.client_rid(named)))
    if isinstance(error, billing.UserDisabled):
        return Forbidden(message)
    if isinstance(error, billing.UnknownApiKey):
        return NotFound(message, param="key_name")
    if isinstance(error, billing.UnknownUser | billing.UnknownBatch):
        return NotFound(message)
    if isinstance(error, billing.IdempotencyConflict):
        return Conflict(message, param="rid")
    if isinstance(error, billing.DuplicateUser | billing.DuplicateApiKey):
        return Conflict(message, param="name")
    if isinstance(error, billing.InvalidInput):
        return InvalidRequest(message, param=error.field)
    return InvalidRequest(message)


def _credits(micros: int) -> str:
    """Micro-credits as credits, exactly: 20000000 -> '20', 1500 -> '0.0015'."""
    whole, fraction = divmod(micros, 1_000_000)
    return f"{whole:,}" + (f".{fraction:06d}".rstrip("0") if fraction else "")


def _what_is_held(requested_micros: int, fee_micros: int) -> str:
    """The bid, or the bid and the request fee held with it (docs/SPEC.md section 5)."""
    if not fee_micros:
        return f"the bid of {_credits(requested_micros)} credits"
    bid = requested_micros - fee_micros
    return (
        f"the bid of {_credits(bid)} credits plus the request fee of {_credits(fee_micros)}"
        f" credits (every request pays it, zero bids included), {_credits(requested_micros)}"
        " credits,"
    )


def _insufficient_funds(error: billing.InsufficientFunds, fee_micros: int = 0) -> str:
    renews = ""
    if error.renews_at is not None:
        moment = error.renews_at.astimezone(UTC).isoformat(timespec="seconds")
        renews = f", wait for the budget to renew at {moment.replace('+00:00', 'Z')}"
    return (
        f"{_what_is_held(error.requested_micros, fee_micros)} is more than the "
        f"{_credits(error.available_micros)} credits available to user {error.name!r} "
        f"({error.requested_micros} micro-credits requested, {error.available_micros} "
        f"available); bid less, wait for held bids to settle{renews}, or ask an admin to "
        "raise the budget"
    )


def _over_batch_cap(error: billing.BatchCapExceeded, fee_micros: int = 0) -> str:
    return (
        f"user {error.name!r} may hold at most {_credits(error.cap_micros)} credits per batch "
        f"({error.cap_micros} micro-credits): {_credits(error.held_micros)} are already held "
        f"and this request holds {_what_is_held(error.requested_micros, fee_micros)}; bid "
        "less, or send the request after the current batch closes"
    )
