"""Errors the HTTP API returns, and the one place that renders them.

    ServiceError (status, type, message, param)
     ├── InvalidRequest          400  bad JSON, a bad field, a limit exceeded
     ├── Unauthenticated         401  missing or unknown API key
     ├── PaymentRequired         402  the budget cannot cover the bid
     ├── Forbidden               403  a user key on an admin route, a disabled account
     ├── NotFound                404
     ├── IdempotencyConflict     409  a rid reused with another payload
     ├── RateLimited             429  with Retry-After
     ├── EngineFailed            502  the engine errored, refused or cut the stream
     ├── Unavailable             503  shutting down or the queue is full
     └── EngineTimedOut          504

Every error body is `{"error": {"type": ..., "message": ..., "param": ...}}`. Services raise
these (or ledger errors, mapped by `from_ledger_error`); `server.api.error_handlers` renders
them, and routes never build error responses themselves.
"""

from __future__ import annotations

from typing import Any

from billing import errors as ledger_errors


class ServiceError(Exception):
    """An error with an HTTP status, a machine-readable type and a message for people."""

    status_code = 500
    error_type = "internal_error"

    def __init__(
        self, message: str, *, param: str | None = None, headers: dict[str, str] | None = None
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        """The JSON body of the response."""
        return {"error": {"type": self.error_type, "message": self.message, "param": self.param}}


class InvalidRequest(ServiceError):
    status_code, error_type = 400, "invalid_request"


class Unauthenticated(ServiceError):
    status_code, error_type = 401, "unauthenticated"


class PaymentRequired(ServiceError):
    status_code, error_type = 402, "insufficient_funds"


class Forbidden(ServiceError):
    status_code, error_type = 403, "forbidden"


class NotFound(ServiceError):
    status_code, error_type = 404, "not_found"


class IdempotencyConflict(ServiceError):
    status_code, error_type = 409, "idempotency_conflict"


class RateLimited(ServiceError):
    status_code, error_type = 429, "rate_limited"


class EngineFailed(ServiceError):
    status_code, error_type = 502, "engine_error"


class Unavailable(ServiceError):
    status_code, error_type = 503, "unavailable"


class EngineTimedOut(ServiceError):
    status_code, error_type = 504, "engine_timeout"


def from_ledger_error(error: ledger_errors.LedgerError) -> ServiceError:
    """Map a refused ledger operation to the HTTP error a client should see."""
    message = str(error)
    if isinstance(error, ledger_errors.InsufficientFunds | ledger_errors.BatchCapExceeded):
        return PaymentRequired(message, param="bid")
    if isinstance(error, ledger_errors.UserDisabled):
        return Forbidden(message)
    if isinstance(error, ledger_errors.UnknownUser | ledger_errors.UnknownBatch):
        return NotFound(message)
    if isinstance(error, ledger_errors.IdempotencyConflict):
        return IdempotencyConflict(message, param="rid")
    if isinstance(error, ledger_errors.DuplicateUser):
        return IdempotencyConflict(message, param="name")
    if isinstance(error, ledger_errors.InvalidInput):
        return InvalidRequest(message, param=error.field)
    return InvalidRequest(message)
