"""An `x-request-id` header on every response, so a user can quote one answer to an operator.

A well-formed id sent by the client (or a proxy in front) is kept; otherwise one is made.
Written as plain ASGI so that streamed responses get the header on their first bytes too. The
other headers every response carries (the replica's name) are added in the same place, so that
a response's headers are copied once, by one `send` wrapper, rather than once per header.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Sequence

from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

HEADER = "x-request-id"
_RAW_HEADER = HEADER.encode()
# What a sensible id looks like; anything else from outside is replaced, not echoed.
_ACCEPTED = re.compile(r"^[A-Za-z0-9._:@+=/-]{1,128}$")


def new_request_id() -> str:
    """A fresh, unguessable request id."""
    return "req_" + secrets.token_hex(12)


class RequestIdMiddleware:
    """Adds `x-request-id` to every HTTP response and to the request's scope state, and after
    it `extra_headers` (raw names and values, as ASGI sends them)."""

    def __init__(self, app: ASGIApp, extra_headers: Sequence[tuple[bytes, bytes]] = ()) -> None:
        self.app = app
        self._extra_headers = list(extra_headers)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        given = _header(scope, HEADER.encode())
        request_id = given if given is not None and _ACCEPTED.match(given) else new_request_id()
        scope.setdefault("state", {})["request_id"] = request_id

        started = False

        async def send_with_id(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                headers = [
                    (k, v) for k, v in message.get("headers", []) if k.lower() != _RAW_HEADER
                ]
                headers.append((_RAW_HEADER, request_id.encode()))
                headers += self._extra_headers
                message = {**message, "headers": headers}
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        except Exception as error:
            # Starlette answers unexpected errors outside every middleware, where this one
            # could not add the header; answer here with the app's own handler instead.
            handler = scope["app"].exception_handlers.get(Exception) if "app" in scope else None
            if started or handler is None:
                raise
            response = await handler(Request(scope, receive), error)
            await response(scope, receive, send_with_id)


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", []):
        if key.lower() == name:
            try:
                return str(value.decode("ascii"))
            except UnicodeDecodeError:
                return None
    return None
