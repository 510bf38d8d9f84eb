"""What a log line says about the request it belongs to: its id, its user and its batch.

Three context variables, set where each becomes known: the request id by the outermost
middleware (`api.middleware.RequestIdMiddleware`), the user once the key is authenticated
(`api.deps.current_user`), and the ticket once the request is admitted
(`serving.service.AuctionService`). The batch is read from the ticket when a line is written,
so every line after the auction cleared it names the batch without anything setting it.

A request's work outside its handler's task carries them too: the task that follows a
request at the engine (`serving.dispatch`) starts in a context of its own with the request's
id, user and ticket. The W3C trace headers a client sent (`traceparent`, `tracestate`) travel
the same way, and go on to the engine with the request (`engine.sglang_http`).
"""

from __future__ import annotations

import logging
from contextvars import Context, ContextVar, copy_context
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from inference_auctions.server.serving.tickets import Ticket

__all__ = [
    "RequestFields",
    "bind_user",
    "current_request_id",
    "current_trace_headers",
    "request_context",
    "request_id_var",
    "ticket_var",
    "trace_headers_var",
    "user_var",
]

request_id_var: ContextVar[str | None] = ContextVar("request_id", default=None)
user_var: ContextVar[str | None] = ContextVar("user", default=None)
ticket_var: ContextVar[Ticket | None] = ContextVar("ticket", default=None)
# The trace headers as raw HTTP header lines (`traceparent: ...\r\n`), ready to be written
# into the request to the engine; empty when the client sent none.
trace_headers_var: ContextVar[bytes] = ContextVar("trace_headers", default=b"")


def bind_user(name: str) -> None:
    """The authenticated user of the request running now."""
    user_var.set(name)


def current_request_id() -> str | None:
    """The id of the request running now, if any."""
    return request_id_var.get()


def current_trace_headers() -> bytes:
    """The trace headers of the request running now, as header lines (empty if none)."""
    return trace_headers_var.get()


class RequestFields(logging.Filter):
    """Puts `request_id`, `user` and `batch` on every record (None outside a request)."""

    def filter(self, record: logging.LogRecord) -> bool:
        ticket = ticket_var.get()
        record.request_id = request_id_var.get()
        record.user = user_var.get() or (ticket.user if ticket is not None else None)
        clearance = ticket.clearance if ticket is not None else None
        record.batch = clearance.batch_id if clearance is not None else None
        return True


def request_context(ticket: Ticket) -> Context:
    """A copy of the current context with `ticket`'s request bound: for a task that works on
    that request outside its handler's task."""
    context = copy_context()
    context.run(_bind, ticket)
    return context


def _bind(ticket: Ticket) -> None:
    request_id_var.set(ticket.request_id)
    user_var.set(ticket.user)
    ticket_var.set(ticket)
    trace_headers_var.set(ticket.trace_headers)
