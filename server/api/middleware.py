"""The ASGI layers in front of the app: request ids, and the generation routes answered directly.

A well-formed id sent by the client (or a proxy in front) is kept; otherwise one is made.
Written as plain ASGI so that streamed responses get the header on their first bytes too. The
other headers every response carries (the replica's name) are added in the same place, so that
a response's headers are copied once, by one `send` wrapper, rather than once per header.

The generation routes answered without FastAPI's per-request layers.

Under load, the layers between uvicorn and a generation route cost about a fifth of the
server's CPU: Starlette's exception middleware, FastAPI's exit-stack middleware, the router
trying every route in turn, the request handler solving dependencies, and a `send` wrapper
for each. The generation routes need none of it: each is a coroutine that takes the
`Request` alone, reads and checks its own body, and returns a `Response`.

`DirectRoutes` is the innermost middleware. For an exact method and path of such a route it
calls the endpoint itself, renders what the endpoint raises with the app's own exception
handlers, as Starlette's `ExceptionMiddleware` does around a route, and sends the response.
Everything else goes on to FastAPI unchanged. The routes stay registered in FastAPI: they
make the OpenAPI document, and FastAPI keeps answering what is not an exact match (another
method: 405; a trailing slash: the redirect). The outer middlewares and the catch-all handler
for unexpected errors see both ways in alike.
"""

from __future__ import annotations

import inspect
import re
import secrets
import typing
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any

from fastapi import APIRouter
from fastapi.routing import APIRoute
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from inference_auctions.server.api.user_limits import SCOPE_KEY as RATELIMIT_SCOPE_KEY
from inference_auctions.server.request_context import request_id_var, trace_headers_var

__all__ = ["DirectRoutes", "RequestIdMiddleware", "find_routes"]

HEADER = "x-request-id"
_RAW_HEADER = HEADER.encode()
# What a sensible id looks like; anything else from outside is replaced, not echoed.
_ACCEPTED = re.compile(r"^[A-Za-z0-9._:@+=/-]{1,128}$")
# W3C Trace Context: passed on to the engine, so that a trace does not break at this hop.
_TRACE_HEADERS = (b"traceparent", b"tracestate")
_TRACE_VALUE = re.compile(rb"^[\x20-\x7e]{1,512}$")  # printable ASCII, as the spec allows


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
        given, trace = _id_and_trace(scope)
        request_id = given if given is not None and _ACCEPTED.match(given) else new_request_id()
        scope.setdefault("state", {})["request_id"] = request_id
        # For the log lines of this request and the engine's request (`server.request_context`).
        request_id_var.set(request_id)
        if trace:
            trace_headers_var.set(trace)

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
                # A user with rate limits of its own: OpenAI's x-ratelimit-* (`user_limits`),
                # unless the answer has its own (a 429 tells the state that refused it).
                limits = scope["state"].get(RATELIMIT_SCOPE_KEY)
                if limits:
                    sent = {k.lower() for k, _ in headers}
                    headers += [(k, v) for k, v in limits if k not in sent]
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


def _id_and_trace(scope: Scope) -> tuple[str | None, bytes]:
    """The request id the client sent, and its W3C trace headers as header lines for the
    engine (a well-formed value only: a line break in it would forge headers there)."""
    given: str | None = None
    trace = b""
    for key, value in scope.get("headers", []):
        name = key.lower()
        if name == _RAW_HEADER:
            try:
                given = value.decode("ascii")
            except UnicodeDecodeError:
                given = None
        elif name in _TRACE_HEADERS and _TRACE_VALUE.match(value):
            trace += name + b": " + value + b"\r\n"
    return given, trace


Handler = Callable[[Request, Exception], Awaitable[Response | None]]


class DirectRoutes:
    """ASGI middleware: calls the endpoints of `routes` directly, passes on everything else."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        routes: Sequence[APIRoute],
        exception_handlers: Mapping[Any, Callable[..., Any]],
    ) -> None:
        self.app = app
        self._routes = {
            (method, route.path): route
            for route in map(_checked, routes)
            for method in route.methods or ()
        }
        self._by_class, self._by_status = route_handlers(exception_handlers)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Answer an exact match of a direct route here; pass anything else on."""
        # A root path is FastAPI's to strip before matching; such a request simply goes there.
        if scope["type"] != "http" or scope.get("root_path"):
            await self.app(scope, receive, send)
            return
        route = self._routes.get((scope["method"], scope["path"]))
        if route is None:
            await self.app(scope, receive, send)
            return
        # What FastAPI's router puts in the scope of a matched route.
        scope["endpoint"], scope["path_params"], scope["route"] = route.endpoint, {}, route
        request = Request(scope, receive, send)
        started = False

        async def sender(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            response = await route.endpoint(request)
            await response(scope, receive, sender)
        except Exception as error:
            handler = self._handler_for(error)
            if handler is None:
                raise  # to the outer middlewares: unexpected errors are answered there
            if started:
                message = "Caught handled exception, but response already started."  # Starlette's
                raise RuntimeError(message) from error
            answer = await handler(request, error)
            if answer is not None:
                await answer(scope, receive, sender)
            # As Starlette does: a reused exception instance must not pile up tracebacks.
            error.__traceback__ = None

    def _handler_for(self, error: Exception) -> Handler | None:
        if isinstance(error, HTTPException):
            handler = self._by_status.get(error.status_code)
            if handler is not None:
                return handler
        for cls in type(error).__mro__:
            handler = self._by_class.get(cls)
            if handler is not None:
                return handler
        return None


def route_handlers(
    handlers: Mapping[Any, Callable[..., Any]],
) -> tuple[dict[type, Handler], dict[int, Handler]]:
    """The app's exception handlers that answer inside the middlewares, as FastAPI splits
    them: by exception class and by HTTP status, without the catch-all (`Exception` or 500),
    which answers outside every middleware."""
    by_class: dict[type, Handler] = {}
    by_status: dict[int, Handler] = {}
    for key, handler in handlers.items():
        if key in (500, Exception):
            continue
        if isinstance(key, int):
            by_status[key] = _as_coroutine(handler)
        else:
            by_class[key] = _as_coroutine(handler)
    return by_class, by_status


def _as_coroutine(handler: Callable[..., Any]) -> Handler:
    if inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(
        getattr(handler, "__call__", None)  # noqa: B004 -- an async callable object counts too
    ):
        return typing.cast(Handler, handler)

    async def in_thread(request: Request, error: Exception) -> Response | None:
        result: Response | None = await run_in_threadpool(handler, request, error)
        return result

    return in_thread


def find_routes(
    routers: Iterable[APIRouter], endpoints: Iterable[Callable[..., Any]]
) -> list[APIRoute]:
    """The routes of `routers` whose endpoint is one of `endpoints`, each of them found once."""
    wanted = list(endpoints)
    found = [
        route
        for router in routers
        for route in router.routes
        if isinstance(route, APIRoute) and route.endpoint in wanted
    ]
    missing = [e.__name__ for e in wanted if [r.endpoint for r in found].count(e) != 1]
    if missing:
        raise ValueError(f"not routed exactly once: {', '.join(missing)}")
    return found


def _checked(route: APIRoute) -> APIRoute:
    """`route`, if calling its endpoint with the request alone is all FastAPI would do."""
    dependant = route.dependant
    fastapi_work = (
        dependant.path_params,
        dependant.query_params,
        dependant.header_params,
        dependant.cookie_params,
        dependant.body_params,
        dependant.dependencies,
    )
    returns = typing.get_type_hints(route.endpoint).get("return")
    plain = (
        not any(fastapi_work)
        and dependant.request_param_name is not None
        and len(inspect.signature(route.endpoint).parameters) == 1
        and inspect.iscoroutinefunction(route.endpoint)
        and isinstance(returns, type)
        and issubclass(returns, Response)
        and route.max_body_size is None
        and "{" not in route.path
    )
    if not plain:
        raise ValueError(
            f"{route.path} cannot be routed directly: its endpoint must be a coroutine that "
            "takes the request alone and returns a Response, on a fixed path"
        )
    return route
