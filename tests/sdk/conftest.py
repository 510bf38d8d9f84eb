"""Fixtures for the SDK tests: a fake server behind `httpx.MockTransport`, and fast retries."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from inference_auctions.sdk import _constants

from .fake_server import FakeServer
from .live_server import LiveServer, live_server

BASE_URL = "http://auction.test"


@pytest.fixture
def fast_retries(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Shrink the backoff so retry tests take milliseconds."""
    monkeypatch.setattr(_constants, "INITIAL_RETRY_DELAY", 0.001)
    monkeypatch.setattr(_constants, "MAX_RETRY_DELAY", 0.004)
    yield


@pytest.fixture
def server() -> FakeServer:
    """A fresh fake server, one request per batch."""
    return FakeServer()


def transport(server: FakeServer) -> httpx.MockTransport:
    """A sync transport serving `server`."""
    return httpx.MockTransport(server.handle)


def async_transport(server: FakeServer) -> httpx.MockTransport:
    """An async transport serving `server`."""
    return httpx.MockTransport(server.ahandle)


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """One real server per test module; each test makes its own users."""
    with live_server(tmp_path_factory.mktemp("live")) as server:
        yield server
