"""An `x-request-id` header on every response, so a user can quote one answer to an operator.

A well-formed id sent by the client (or a proxy in front) is kept; otherwise one is made.
Written as plain ASGI so that streamed responses get the header on their first bytes too.
"""

from __future__ import annotations

import re
import secrets

from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

HEADER = "x-request-id"
# What a sensible id looks like; anything else from outside is replaced, not echoed.
_ACCEPTED = re.compile(r"^[A-Za-z0-9._:@+=/-]{1,128}$")


def new_request_id() -> str:
    """A fresh, unguessable request id."""
    return "req_" + secrets.token_hex(12)


class RequestIdMiddleware:
    """Adds `x-request-id` to every HTTP response and to the request's scope state."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

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
                    (k, v) for k, v in message.get("headers", []) if k.lower() != b"x-request-id"
                ]
                headers.append((HEADER.encode(), request_id.encode()))
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
