"""The one place that turns exceptions into JSON error responses: never a traceback."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from inference_auctions import billing
from inference_auctions.server.api.json_response import JSONBytes
from inference_auctions.server.api.schemas import describe_validation_error
from inference_auctions.server.errors import (
    Forbidden,
    InvalidRequest,
    NotFound,
    ServiceError,
    Unauthenticated,
    from_ledger_error,
)

log = logging.getLogger(__name__)

# Paths a client of SGLang or OpenAI tries on this server, and the route it means.
_MEANT = {
    "/v1/generate": "/generate",
    "/chat/completions": "/v1/chat/completions",
    "/completions": "/v1/completions",
    "/models": "/v1/models",
    "/v1/balance": "/v1/ledger/balance",
    "/balance": "/v1/ledger/balance",
}


def _no_route(request: Request) -> NotFound:
    """A 404 for a path no route serves, naming the route a client most likely meant."""
    path = request.url.path
    meant = _MEANT.get(path)
    hint = f"did you mean {meant}? " if meant else ""
    return NotFound(f"this server has no route {path[:128]!r}; {hint}every route is at /docs")


def _render(error: ServiceError, request: Request | None = None) -> JSONBytes:
    if request is not None:
        _count_refusal(request, error)
    return JSONBytes(error.body(), status_code=error.status_code, headers=error.headers)


def _count_refusal(request: Request, error: ServiceError) -> None:
    """Count an error answer in `inference_auction_refused_requests_total`, by status and
    reason (the error's type), on the server's metrics once they exist."""
    services = getattr(request.app.state, "services", None)
    if services is not None:
        services.service.metrics.count_refusal(error.status_code, error.error_type)


def install_error_handlers(app: FastAPI) -> None:
    """Render every error as JSON with the right status; never a traceback."""

    async def service_error(request: Request, error: Exception) -> JSONBytes:
        assert isinstance(error, ServiceError)
        return _render(error, request)

    async def ledger_error(request: Request, error: Exception) -> JSONBytes:
        assert isinstance(error, billing.LedgerError)
        if isinstance(error, billing.LedgerUnavailable):
            # Unreachable, locked past its timeout or out of connections: the transaction did
            # not commit, so nothing was written. One line in the log, a 503 out.
            log.warning("ledger unavailable: %s", error.cause)
        return _render(from_ledger_error(error), request)

    async def validation_error(request: Request, error: Exception) -> JSONBytes:
        assert isinstance(error, RequestValidationError)
        return _render(validation_to_invalid_request(error.errors()), request)

    async def http_error(request: Request, error: Exception) -> JSONBytes:
        assert isinstance(error, StarletteHTTPException)
        if error.status_code == 404 and error.detail == "Not Found":  # the router's own
            return _render(_no_route(request))
        kind = {404: NotFound, 401: Unauthenticated, 403: Forbidden}.get(error.status_code)
        if kind is not None:
            return _render(kind(str(error.detail)), request)
        failure = ServiceError(str(error.detail))
        failure.status_code, failure.error_type = error.status_code, "http_error"
        failure.code = "http_error"
        return _render(failure, request)

    async def unexpected(request: Request, error: Exception) -> JSONBytes:
        log.exception("unhandled error", exc_info=error)
        failure = ServiceError("internal error; the request changed nothing it reported")
        return _render(failure, request)

    app.add_exception_handler(ServiceError, service_error)
    app.add_exception_handler(billing.LedgerError, ledger_error)
    app.add_exception_handler(RequestValidationError, validation_error)
    app.add_exception_handler(StarletteHTTPException, http_error)
    app.add_exception_handler(Exception, unexpected)


def validation_to_invalid_request(errors: Any) -> InvalidRequest:
    """Turn pydantic's error list into one message that names the first bad field."""
    message, param = describe_validation_error(errors)
    return InvalidRequest(message, param=param)
