"""The generation routes answered by `api.middleware.DirectRoutes`: taken for exact matches only,
and indistinguishable from FastAPI's answers (status, headers, bodies) on every way a request
ends."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Iterator
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any, cast

import httpx
import pytest
from fastapi import Depends, FastAPI, Request
from fastapi.routing import APIRoute, APIRouter
from starlette.exceptions import HTTPException
from starlette.responses import PlainTextResponse, Response, StreamingResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from inference_auctions.billing import Ledger
from inference_auctions.server.api.middleware import DirectRoutes, find_routes
from inference_auctions.server.app import GENERATION_ENDPOINTS, create_app
from inference_auctions.server.emulator.embedded import EmbeddedEngine
from inference_auctions.server.engine.errors import EngineError, EngineTimeout
from inference_auctions.server.engine.protocol import TokenArray
from inference_auctions.server.settings import ServerSettings
from tests.db_fixtures import MigratedDatabase
from tests.server.harness import TEST_SETTINGS

GENERATION_PATHS = ("/generate", "/v1/completions", "/v1/chat/completions")
# Prompts that fail in the engine (see `_FaultyEngine`), and an empty one.
_FAULTY_PROMPTS = ("crash", "down", "slow", "")


class _FaultyEngine(EmbeddedEngine):
    """The embedded engine, failing to tokenize three magic prompts in three ways."""

    async def tokenize_array(self, text: str) -> TokenArray:
        if text == "crash":
            raise RuntimeError("a bug")
        if text == "down":
            raise EngineError("the engine is down")
        if text == "slow":
            raise EngineTimeout("no answer in time")
        return await super().tokenize_array(text)


def _through_fastapi(app: FastAPI) -> FastAPI:
    """`app` answering every route through FastAPI, as before the direct routes."""
    app.user_middleware = [
        m for m in app.user_middleware if cast(object, m.cls) is not DirectRoutes
    ]
    return app


class _ScopeRecorder:
    """Outermost middleware keeping each request's scope, as the layers inside left it."""

    def __init__(self, app: ASGIApp, scopes: list[Scope]) -> None:
        self.app = app
        self.scopes = scopes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.scopes.append(scope)
        await self.app(scope, receive, send)


@asynccontextmanager
async def _client(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    """A client of `app`, started through its lifespan, in this event loop."""
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            yield client


def _settings(db: MigratedDatabase) -> ServerSettings:
    # A burst of two, so that the third request of a key in a row is refused (429).
    limits = {"rate_limit_per_second": 0.001, "rate_limit_burst": 2}
    return ServerSettings(database_url=db.url, replica_name="gpu-7", **{**TEST_SETTINGS, **limits})


@pytest.mark.anyio
async def test_the_generation_routes_never_reach_fastapis_router(
    ledger_db: MigratedDatabase,
) -> None:
    scopes: list[Scope] = []
    app = create_app(_settings(ledger_db), engine=_FaultyEngine(time_scale=0.002))
    app.add_middleware(_ScopeRecorder, scopes=scopes)

    async with _client(app) as client:
        for path in GENERATION_PATHS:
            assert (await client.post(path, json={})).status_code == 401
        assert (await client.get("/v1/models")).status_code == 200
        assert (await client.get("/generate")).status_code == 405
    direct, models, wrong_method = scopes[:3], scopes[3], scopes[4]
    for scope in direct:
        assert "router" not in scope and "starlette.exception_handlers" not in scope
        assert scope["route"].endpoint in GENERATION_ENDPOINTS
    # The other routes, and the generation paths under another method, are FastAPI's.
    assert "router" in models and "router" in wrong_method


def _normalized(response: httpx.Response) -> dict[str, Any]:
    """What a client can see, with the parts that differ on every request made alike."""
    headers = [
        (name, re.sub(r"^req_[0-9a-f]{24}$", "req_…", value))
        for name, value in response.headers.multi_items()
    ]
    body: Any = response.text
    if response.status_code == 200 and body:  # one JSON document, or events of one each
        events = [part.removeprefix("data: ") for part in body.split("\n\n") if part]
        body = [_shape(json.loads(e)) if e != "[DONE]" else e for e in events]
        headers = [(n, "…" if n == "content-length" else v) for n, v in headers]
    return {"status": response.status_code, "headers": headers, "body": body}


def _shape(value: Any) -> Any:
    """The keys and value types of a JSON document (generated text, ids and times vary)."""
    if isinstance(value, dict):
        return {key: _shape(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_shape(item) for item in value[:1]]
    return type(value).__name__


def _requests(keys: dict[str, str]) -> Iterator[tuple[str, str, dict[str, str], Any]]:
    """(method, path, headers, body) of every outcome worth comparing, on each route."""
    bodies: dict[str, tuple[str | None, dict[str, Any]]] = {
        "/generate": (
            "text",
            {"text": "hi", "bid": "0.01", "sampling_params": {"max_new_tokens": 4}},
        ),
        "/v1/completions": ("prompt", {"prompt": "hi", "bid": "0.01", "max_tokens": 4}),
        "/v1/chat/completions": (
            None,
            {"messages": [{"role": "user", "content": "hi"}], "bid": "0.01", "max_tokens": 4},
        ),
    }
    for path, (prompt_field, ok) in bodies.items():

        def key(name: str, path: str = path) -> dict[str, str]:
            return {"authorization": f"Bearer {keys[name + path]}"}

        yield "POST", path, {}, ok
        yield "POST", path, {"authorization": "Bearer not-a-key"}, ok
        yield "POST", path, {"authorization": "Basic abc"}, ok
        yield "POST", path, key("disabled"), ok
        yield "POST", path, key("poor"), ok
        yield "POST", path, key("rich"), b"{not json"
        yield "POST", path, key("rich"), {**ok, "bid": [1]}
        yield "POST", path, key("rich"), {**ok, "bidd": "0.01"}
        yield "POST", path, key("rich2"), {**ok, "bid": "99999999"}
        yield "POST", path, {**key("rich2"), "content-length": "99999999999"}, b"{}"
        yield "POST", path, key("limited"), b"1"
        yield "POST", path, key("limited"), b"2"
        yield "POST", path, key("limited"), b"3"  # the third in a row: 429 with Retry-After
        yield "POST", path, {"x-request-id": "trace-7"}, ok
        yield "POST", path, {"x-request-id": "not a well-formed id"}, ok
        yield "POST", path + "?debug=1", {}, ok
        yield "POST", path + "/", {}, ok
        for method in ("GET", "HEAD", "OPTIONS", "PUT"):
            yield method, path, {}, None
        yield "POST", path, key("served"), ok
        yield "POST", path, key("streamed"), {**ok, "stream": True}
        if prompt_field is not None:
            for prompt in _FAULTY_PROMPTS:
                yield "POST", path, key(prompt or "empty"), {**ok, prompt_field: prompt}


def _users(db: MigratedDatabase) -> dict[str, str]:
    ledger = Ledger(db.new_engine())
    names = ["disabled", "poor", "rich", "rich2", "limited", "served", "streamed", "empty"]
    names += _FAULTY_PROMPTS[:3]
    keys = {}
    for number, path in enumerate(GENERATION_PATHS):
        for name in names:
            budget = 10 if name == "poor" else 10_000_000
            user = f"{name}{number}"
            keys[name + path] = ledger.create_user(user, budget_micros=budget).api_key
            if name == "disabled":
                ledger.disable_user(user)
    ledger.close()
    return keys


@pytest.mark.anyio
async def test_direct_answers_are_fastapis_answers(ledger_db: MigratedDatabase) -> None:
    keys = _users(ledger_db)
    settings = _settings(ledger_db)
    direct = create_app(settings, engine=_FaultyEngine(time_scale=0.002))
    routed = _through_fastapi(create_app(settings, engine=_FaultyEngine(time_scale=0.002)))

    answers = []
    async with AsyncExitStack() as stack:
        ours = await stack.enter_async_context(_client(direct))
        theirs = await stack.enter_async_context(_client(routed))
        for method, path, headers, body in _requests(keys):
            kind = {"content": body} if isinstance(body, bytes) else {"json": body}
            options: dict[str, Any] = {"headers": headers, **(kind if body is not None else {})}
            answer = await ours.request(method, path, **options)
            reference = await theirs.request(method, path, **options)
            request = (method, path, headers, body)
            answers.append((request, _normalized(answer), _normalized(reference)))
    for request, answer, reference in answers:
        assert answer == reference, request
    statuses = {answer["status"] for _, answer, _ in answers}
    assert statuses == {200, 307, 400, 401, 402, 403, 405, 429, 500, 502, 504}
    for _, answer, _ in answers:
        assert [n for n, _ in answer["headers"]][-2:] == [
            "x-request-id",
            "x-inference-auction-replica",
        ]


# The rules of Starlette's exception middleware, on an app of its own.


class _Teapot(HTTPException):
    pass


class _Base(Exception):
    pass


class _Derived(_Base):
    pass


def _raising_app(direct: bool) -> FastAPI:
    """An app whose one route raises what the path names, with handlers by status, by class
    (sync and async) and a catch-all."""
    app = FastAPI()

    async def raising(request: Request) -> Response:
        kind = request.url.path.rsplit("/", 1)[-1]
        errors: dict[str, Exception] = {
            "teapot": _Teapot(418, "short and stout"),
            "forbidden": HTTPException(403, "no"),
            "derived": _Derived("by its base class's handler"),
            "sync": LookupError("by a sync handler"),
            "unhandled": ZeroDivisionError("by the catch-all, outside"),
            "silent": KeyError("a handler that returns nothing"),
        }
        if kind == "late":

            async def body() -> AsyncIterator[bytes]:
                yield b"part"
                raise _Derived("after the response started")

            return StreamingResponse(body())
        raise errors[kind]

    async def by_status(request: Request, error: Exception) -> Response:
        return PlainTextResponse(f"status handler: {error}", status_code=418)

    async def by_base(request: Request, error: Exception) -> Response:
        return PlainTextResponse(f"base handler: {error}", status_code=409)

    def in_thread(request: Request, error: Exception) -> Response:
        return PlainTextResponse(f"sync handler: {error}", status_code=410)

    async def silent(request: Request, error: Exception) -> None:
        return None

    async def catch_all(request: Request, error: Exception) -> Response:
        return PlainTextResponse("catch-all", status_code=500)

    app.add_exception_handler(418, by_status)
    app.add_exception_handler(_Base, by_base)
    app.add_exception_handler(LookupError, in_thread)
    app.add_exception_handler(KeyError, silent)  # type: ignore[arg-type]  # Starlette allows None
    app.add_exception_handler(Exception, catch_all)
    router = APIRouter()
    for kind in ("teapot", "forbidden", "derived", "sync", "unhandled", "silent", "late"):
        router.add_api_route(f"/raise/{kind}", raising, methods=["POST"], name=kind)
    app.include_router(router)
    if direct:
        routes = [route for route in router.routes if isinstance(route, APIRoute)]
        handlers = app.exception_handlers
        app.add_middleware(DirectRoutes, routes=routes, exception_handlers=handlers)
    return app


@pytest.mark.anyio
@pytest.mark.parametrize(
    "kind", ["teapot", "forbidden", "derived", "sync", "unhandled", "silent", "late"]
)
async def test_exceptions_are_rendered_by_the_same_handlers(kind: str) -> None:
    async def answer(app: FastAPI) -> tuple[int, str, list[tuple[str, str]]]:
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            try:
                response = await client.post(f"/raise/{kind}")
            except Exception as error:  # the app ended without a whole response
                return 0, f"{type(error).__name__}: {error} (from {error.__cause__!r})", []
            return response.status_code, response.text, response.headers.multi_items()

    assert await answer(_raising_app(direct=True)) == await answer(_raising_app(direct=False))


def test_a_route_that_needs_fastapi_is_refused() -> None:
    async def needs_a_dependency(request: Request, value: int = Depends(lambda: 1)) -> Response:
        return Response()

    async def returns_data(request: Request) -> dict[str, int]:
        return {}

    router = APIRouter()
    router.add_api_route("/dependency", needs_a_dependency, methods=["POST"])
    router.add_api_route("/data", returns_data, methods=["POST"])
    for route in router.routes:
        assert isinstance(route, APIRoute)
        with pytest.raises(ValueError, match="cannot be routed directly"):
            DirectRoutes(FastAPI(), routes=[route], exception_handlers={})
    with pytest.raises(ValueError, match="not routed exactly once: returns_data"):
        find_routes([router, router], [returns_data])
