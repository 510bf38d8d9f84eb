"""Every error the SDK raises.

Our exception hierarchy:

* AuctionError
  + ConfigurationError - no base URL or API key, or an unusable state file.
  + InvalidAmountError - a money amount that is negative, NaN, or finer than a micro-credit.
  + BudgetExhaustedError - the budget is spent and the client was told to raise.
  + ClientClosedError - a call on a client after `close()`.
  + APIError
    + APIConnectionError - the server could not be reached or the connection broke.
      - APITimeoutError
    + APIResponseValidationError - a 2xx response whose body does not match the contract.
    + StreamError - the server reported an error in the middle of a stream.
    + APIStatusError - the server answered with a 4xx or 5xx status.
      - BadRequestError (400)
      - AuthenticationError (401)
      - InsufficientFundsError (402)
      - PermissionDeniedError (403)
      - NotFoundError (404)
      + ConflictError (409)
        - IdempotencyConflictError (409, the rid was reused with another payload)
      - UnprocessableEntityError (422)
      - RateLimitError (429)
      + InternalServerError (5xx)
        - EngineError (502)
        - ServiceUnavailableError (503)
        - EngineTimeoutError (504)
"""

from __future__ import annotations

from typing import Any

import httpx

__all__ = [
    "APIConnectionError",
    "APIError",
    "APIResponseValidationError",
    "APIStatusError",
    "APITimeoutError",
    "AuctionError",
    "AuthenticationError",
    "BadRequestError",
    "BudgetExhaustedError",
    "ClientClosedError",
    "ConfigurationError",
    "ConflictError",
    "EngineError",
    "EngineTimeoutError",
    "IdempotencyConflictError",
    "InsufficientFundsError",
    "InternalServerError",
    "InvalidAmountError",
    "NotFoundError",
    "PermissionDeniedError",
    "RateLimitError",
    "ServiceUnavailableError",
    "StreamError",
    "UnprocessableEntityError",
]


class AuctionError(Exception):
    """Base class of every error raised by this SDK."""


class ConfigurationError(AuctionError):
    """The client is missing settings it needs, or was given inconsistent ones."""


class InvalidAmountError(AuctionError, ValueError):
    """A money amount cannot be represented exactly in micro-credits."""


class BudgetExhaustedError(AuctionError):
    """The budget of the current horizon or period is spent; nothing was sent.

    Raised only with `on_budget_exhausted="raise"` (the default); `"bid_zero"` sends the
    request at bid 0 instead, with a warning.
    """

    def __init__(self, message: str, *, spent_micros: int, total_micros: int) -> None:
        super().__init__(message)
        self.spent_micros = spent_micros
        self.total_micros = total_micros


class ClientClosedError(AuctionError):
    """The client was closed; create a new one (or use it as a context manager)."""


class APIError(AuctionError):
    """An error talking to the auction server."""

    message: str
    request: httpx.Request
    body: object | None
    type: str | None
    param: str | None
    code: str | None
    """The error body's `code`, as OpenAI sends it (`rate_limit_exceeded`, `invalid_api_key`...)."""
    request_id: str | None
    """The server's `x-request-id` of the failed response, to quote to its operator."""

    def __init__(self, message: str, request: httpx.Request, *, body: object | None) -> None:
        super().__init__(message)
        self.message = message
        self.request = request
        self.body = body
        error = _error_object(body)
        self.type = _str_or_none(error.get("type"))
        self.param = _str_or_none(error.get("param"))
        self.code = _str_or_none(error.get("code"))
        self.request_id = None


class APIConnectionError(APIError):
    """The request did not produce a response after all retries."""

    may_have_been_processed: bool
    """False only when no attempt can have reached the server (every one failed to connect)."""

    def __init__(
        self,
        request: httpx.Request,
        *,
        message: str | None = None,
        may_have_been_processed: bool = True,
    ) -> None:
        # The URL is in the message: "Connection error." alone leaves a user guessing which
        # server (and which setting of base_url) it was.
        where = f"{request.method} {request.url}"
        super().__init__(f"{message or 'Connection error'} ({where})", request, body=None)
        self.may_have_been_processed = may_have_been_processed


class APITimeoutError(APIConnectionError):
    """The request timed out after all retries."""

    def __init__(
        self,
        request: httpx.Request,
        *,
        message: str = "Request timed out",
        may_have_been_processed: bool = True,
    ) -> None:
        super().__init__(request, message=message, may_have_been_processed=may_have_been_processed)


class APIResponseValidationError(APIError):
    """The server answered 2xx with a body that does not match the contract."""

    response: httpx.Response
    status_code: int

    def __init__(self, response: httpx.Response, *, body: object | None, detail: str) -> None:
        super().__init__(f"Unexpected response body: {detail}", response.request, body=body)
        self.response = response
        self.status_code = response.status_code
        self.request_id = response.headers.get("x-request-id")


class StreamError(APIError):
    """The server sent an error event after the stream had started."""


class APIStatusError(APIError):
    """The server answered with a 4xx or 5xx status code."""

    response: httpx.Response
    status_code: int

    def __init__(self, message: str, *, response: httpx.Response, body: object | None) -> None:
        super().__init__(message, response.request, body=body)
        self.response = response
        self.status_code = response.status_code
        self.request_id = response.headers.get("x-request-id")


class BadRequestError(APIStatusError):
    """400: the request was malformed or a parameter was invalid."""


class AuthenticationError(APIStatusError):
    """401: the API key is missing or wrong."""


class InsufficientFundsError(APIStatusError):
    """402: the account cannot cover the bid."""


class PermissionDeniedError(APIStatusError):
    """403: the key is valid but may not do this."""


class NotFoundError(APIStatusError):
    """404: no such route or object."""


class ConflictError(APIStatusError):
    """409: the request conflicts with the server's state."""


class IdempotencyConflictError(ConflictError):
    """409: this rid was already used with a different payload; never retried."""


class UnprocessableEntityError(APIStatusError):
    """422: the body was well-formed but failed validation."""


class RateLimitError(APIStatusError):
    """429: too many requests; the server says when to come back."""


class InternalServerError(APIStatusError):
    """5xx: the server failed."""


class EngineError(InternalServerError):
    """502: the inference engine failed; the server refunds the charge."""


class EngineTimeoutError(InternalServerError):
    """504: the inference engine timed out; the server refunds the charge."""


class ServiceUnavailableError(InternalServerError):
    """503: the server is overloaded or shutting down."""


_STATUS_ERRORS: dict[int, type[APIStatusError]] = {
    400: BadRequestError,
    401: AuthenticationError,
    402: InsufficientFundsError,
    403: PermissionDeniedError,
    404: NotFoundError,
    409: ConflictError,
    422: UnprocessableEntityError,
    429: RateLimitError,
    502: EngineError,
    503: ServiceUnavailableError,
    504: EngineTimeoutError,
}

IDEMPOTENCY_CONFLICT = "idempotency_conflict"


def make_status_error(response: httpx.Response) -> APIStatusError:
    """Build the exception that matches a failed response's status code and error type."""
    body = _json_or_text(response)
    error = _error_object(body)
    message = _str_or_none(error.get("message")) or f"HTTP {response.status_code}"
    message = f"{response.status_code} {message}"
    request_id = response.headers.get("x-request-id")
    if request_id:
        message = f"{message} (request id {request_id})"
    if response.status_code == 409 and error.get("type") == IDEMPOTENCY_CONFLICT:
        return IdempotencyConflictError(message, response=response, body=body)
    cls = _STATUS_ERRORS.get(response.status_code)
    if cls is None:
        cls = InternalServerError if response.status_code >= 500 else APIStatusError
    return cls(message, response=response, body=body)


def error_type(response: httpx.Response) -> str | None:
    """The `error.type` field of a (read) error response, if it has one."""
    return _str_or_none(_error_object(_json_or_text(response)).get("type"))


def _json_or_text(response: httpx.Response) -> object:
    try:
        return response.json()
    except ValueError:
        return response.text or None


def _error_object(body: object) -> dict[str, Any]:
    if isinstance(body, dict):
        error = body.get("error")
        if isinstance(error, dict):
            return error
    return {}


def _str_or_none(value: object) -> str | None:
    return value if isinstance(value, str) else None
