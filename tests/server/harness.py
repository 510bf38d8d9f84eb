"""A real auction server on a real port: uvicorn in a thread, on a migrated test ledger."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import httpx
import uvicorn

from inference_auctions.billing import Ledger
from inference_auctions.server.api.connections import uvicorn_config
from inference_auctions.server.app import create_app
from inference_auctions.server.settings import ServerSettings
from tests.db_fixtures import MigratedDatabase

# Fast defaults for tests: the emulator runs 500x faster than an H100 would, batches close
# quickly, and few requests may be in flight so that requests queue and priority matters.
TEST_SETTINGS: dict[str, Any] = {
    "batch_size": 8,
    "max_wait_ms": 20,
    "max_inflight": 8,
    "emulator_time_scale": 0.002,
    "run_jobs": False,
    "rate_limit_per_second": 10_000,
    "rate_limit_burst": 10_000,
}


@dataclass
class RunningServer:
    """A started server, its ledger database, and helpers to make users."""

    url: str
    settings: ServerSettings
    ledger: Ledger

    def create_user(self, name: str, budget: int = 10_000_000, admin: bool = False) -> str:
        """Create a user with `budget` micro-credits; returns its API key."""
        return self.ledger.create_user(name, budget_micros=budget, admin=admin).api_key

    def client(self, key: str | None, **kwargs: Any) -> httpx.Client:
        """An HTTP client with the key as bearer token."""
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=60, **kwargs)

    def async_client(self, key: str | None, **kwargs: Any) -> httpx.AsyncClient:
        """An async HTTP client with the key as bearer token."""
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        return httpx.AsyncClient(base_url=self.url, headers=headers, timeout=60, **kwargs)


@contextmanager
def serve_app(settings: ServerSettings, **app_options: Any) -> Iterator[str]:
    """Run the app under uvicorn on a free loopback port until the block ends (drained)."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    config = uvicorn_config(
        create_app(settings, **app_options),
        settings,
        log_level="warning",
        lifespan="on",
        timeout_graceful_shutdown=30,
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [listener]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the test server did not start")
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(60)
        listener.close()


@contextmanager
def running_server(db: MigratedDatabase, **overrides: Any) -> Iterator[RunningServer]:
    """A server on `db` with the test settings and `overrides`."""
    settings = ServerSettings(database_url=db.url, **{**TEST_SETTINGS, **overrides})
    ledger = Ledger(db.new_engine())
    with serve_app(settings) as url:
        yield RunningServer(url=url, settings=settings, ledger=ledger)
