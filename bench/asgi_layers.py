"""The CPU the server's ASGI layers cost per request, in process, with no network and no client.

The app of `create_app` (embedded engine, SQLite ledger in a temporary folder, started through
its lifespan) is called as uvicorn would call it, one request after another, with requests
that fail fast, so that what is timed is the way in and out rather than the auction:

* `POST /generate` without a key: 401, raised while authenticating;
* `POST /generate` with a key and a bad bid: 400, after the key (cached), the rate limit and
  the body's decoding;
* `GET /v1/models`: a route FastAPI routes, for comparison.

Each is timed twice: as served (the generation routes answered by `api.middleware.DirectRoutes`),
and through FastAPI (the same app without that middleware). Times are CPU time of this process
per request, best of --repeat runs of --requests requests. Run: `python -m bench.asgi_layers`.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import cast

from fastapi import FastAPI
from rich.console import Console
from rich.table import Table
from starlette.types import Message

from inference_auctions.billing import Ledger
from inference_auctions.server.api.middleware import DirectRoutes
from inference_auctions.server.app import create_app
from inference_auctions.server.settings import ServerSettings


@dataclass(frozen=True)
class Case:
    """One kind of request and the status it must get."""

    name: str
    method: str
    path: str
    headers: list[tuple[bytes, bytes]]
    body: bytes
    status: int


def cases(key: str) -> list[Case]:
    """The requests timed; `key` is a valid API key."""
    bearer = (b"authorization", b"Bearer " + key.encode())
    json = (b"content-type", b"application/json")
    bad_bid = b'{"text": "hello", "bid": "-1", "sampling_params": {"max_new_tokens": 4}}'
    return [
        Case("POST /generate, no key (401)", "POST", "/generate", [json], b"{}", 401),
        Case("POST /generate, bad bid (400)", "POST", "/generate", [bearer, json], bad_bid, 400),
        Case("GET /v1/models (200)", "GET", "/v1/models", [], b"", 200),
    ]


def _scope(case: Case) -> dict[str, object]:
    headers = [(b"host", b"bench"), (b"content-length", str(len(case.body)).encode())]
    return {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.4"},
        "http_version": "1.1",
        "method": case.method,
        "scheme": "http",
        "path": case.path,
        "raw_path": case.path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": headers + case.headers,
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 8000),
        "state": {},
    }


async def _call(app: FastAPI, case: Case) -> int:
    """One request through `app`; its status."""
    pending = [{"type": "http.request", "body": case.body, "more_body": False}]
    status = 0

    async def receive() -> Message:
        return pending.pop() if pending else {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]

    await app(_scope(case), receive, send)
    return status


async def _time(app: FastAPI, case: Case, requests: int, repeat: int) -> float:
    """Best CPU seconds per request over `repeat` runs."""
    for _ in range(200):  # warm up: caches, the key's cache entry
        assert await _call(app, case) == case.status, case.name
    best = float("inf")
    for _ in range(repeat):
        start = time.process_time()
        for _ in range(requests):
            await _call(app, case)
        best = min(best, (time.process_time() - start) / requests)
    return best


def _through_fastapi(app: FastAPI) -> FastAPI:
    """`app` with the generation routes left to FastAPI (before its middleware is built)."""
    app.user_middleware = [
        m for m in app.user_middleware if cast(object, m.cls) is not DirectRoutes
    ]
    return app


async def _measure(
    prepare: Callable[[FastAPI], FastAPI], requests: int, repeat: int
) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as folder:
        return await _measure_in(Path(folder), prepare, requests, repeat)


async def _measure_in(
    folder: Path, prepare: Callable[[FastAPI], FastAPI], requests: int, repeat: int
) -> dict[str, float]:
    url = f"sqlite:///{folder / 'ledger.db'}"
    settings = ServerSettings(
        database_url=url,
        run_jobs=False,
        rate_limit_per_second=1e9,
        rate_limit_burst=10**9,
        replica_name="bench",
    )
    app = prepare(create_app(settings))
    times: dict[str, float] = {}
    async with app.router.lifespan_context(app):
        ledger = Ledger.from_url(url)
        key = ledger.create_user("bench", budget_micros=10**9).api_key
        ledger.close()
        for case in cases(key):
            times[case.name] = await _time(app, case, requests, repeat)
    return times


def main() -> None:
    """Time each case both ways and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    direct = asyncio.run(_measure(lambda app: app, args.requests, args.repeat))
    routed = asyncio.run(_measure(_through_fastapi, args.requests, args.repeat))
    table = Table(title="CPU per request in the ASGI app (µs)")
    for column in ("request", "through FastAPI", "as served", "saved"):
        table.add_column(column, justify="left" if column == "request" else "right")
    for name, served in direct.items():
        before = routed[name]
        table.add_row(
            name, f"{before * 1e6:.0f}", f"{served * 1e6:.0f}", f"{1 - served / before:.0%}"
        )
    Console().print(table)


if __name__ == "__main__":
    main()
