"""The SDK's automatic retries against the real server: they succeed, and charge once.

A request's first attempt loses its connection before its batch closes (the server releases
its hold); the second reaches a batch whose settlement fails on a locked ledger (503,
Retry-After). The SDK retries both with the same rid and body, and its third attempt is served:
one answer, one charge, nothing refunded, the ledger reconciled. Before holds re-opened for a
retry of the same payload, the second attempt got 409 "already released" and the SDK raised.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from sqlalchemy.engine import make_url

from inference_auctions.billing import Ledger
from inference_auctions.billing import database as ledger_database
from inference_auctions.sdk import AuctionClient, Budget
from inference_auctions.server.settings import ServerSettings
from tests.db_fixtures import MigratedDatabase, migrated_database
from tests.server.harness import TEST_SETTINGS, serve_app

GRANT = 100_000_000


@pytest.fixture
def sqlite_db(tmp_path: Path) -> Iterator[MigratedDatabase]:
    with migrated_database("sqlite", tmp_path) as db:
        yield db


def _wait_until(condition: object, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.02)


class _Faults(httpx.BaseTransport):
    """A real HTTP transport whose first attempt drops its connection, and whose second one
    finds the ledger locked when its batch closes; every later attempt goes through."""

    def __init__(self, db: MigratedDatabase, ledger: Ledger, other: httpx.Client) -> None:
        self.real = httpx.HTTPTransport()
        self.db = db
        self.ledger = ledger
        self.other = other  # another user's client: its request joins the last attempt's batch
        self.attempts = 0
        self.statuses: list[int | str] = []
        self.threads: list[threading.Thread] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        if not request.url.path.endswith("/generate"):
            return self.real.handle_request(request)
        self.attempts += 1
        if self.attempts == 1:
            request.extensions["timeout"] = {**request.extensions["timeout"], "read": 0.3}
            try:
                return self.real.handle_request(request)
            except httpx.ReadTimeout:
                self.statuses.append("dropped")
                raise
        if self.attempts == 2:
            self._later(self._lock_when_held)
        else:
            self._later(lambda: self.statuses.append(self._other_request()))
        response = self.real.handle_request(request)
        self.statuses.append(response.status_code)
        return response

    def close(self) -> None:
        self.real.close()

    def _later(self, work: object) -> None:
        thread = threading.Thread(target=work)  # type: ignore[arg-type]
        thread.start()
        self.threads.append(thread)

    def _lock_when_held(self) -> None:
        # Once the second attempt's hold is re-opened, lock the ledger past the batch's close.
        _wait_until(lambda: len(self._holds()) == 2)
        path = make_url(self.db.url).database
        assert path is not None
        connection = sqlite3.connect(path, isolation_level=None, timeout=5)
        try:
            connection.execute("BEGIN EXCLUSIVE")
            time.sleep(1.2)
            connection.execute("ROLLBACK")
        finally:
            connection.close()

    def _holds(self) -> list[object]:
        return [e for e in self.ledger.entries("ann").entries if e.kind == "hold"]

    def _other_request(self) -> int:
        body = {"text": "ben wonders", "bid": "0.2", "rid": "ben-1"}
        return self.other.post("/generate", json=body).status_code


def test_the_sdk_retries_a_dropped_connection_and_a_failed_settlement_and_pays_once(
    sqlite_db: MigratedDatabase, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ledger_database, "SQLITE_BUSY_TIMEOUT_S", 0.4)
    settings = ServerSettings(
        database_url=sqlite_db.url, **{**TEST_SETTINGS, "batch_size": 2, "max_wait_ms": 700}
    )
    ledger = Ledger(sqlite_db.new_engine())
    keys = {u: ledger.create_user(u, budget_micros=GRANT).api_key for u in ("ann", "ben")}
    with serve_app(settings) as url:
        headers = {"Authorization": f"Bearer {keys['ben']}"}
        with httpx.Client(base_url=url, headers=headers, timeout=30) as ben:
            faults = _Faults(sqlite_db, ledger, ben)
            with AuctionClient(
                base_url=url,
                api_key=keys["ann"],
                budget=Budget(total="50", auctions=10),
                transport=faults,
                max_retries=4,
            ) as client:
                result = client.generate("ann asks once", value="1", max_new_tokens=4, rid="once")
                for thread in faults.threads:
                    thread.join(10)
                spent = client.bidder.spent_micros
    assert faults.statuses[:2] == ["dropped", 503]
    assert sorted(map(str, faults.statuses[2:])) == ["200", "200"]  # ann's and ben's
    assert result.rid == "once" and result.text
    charge = result.auction.charge_micros
    assert charge > 0 and result.auction.batch_size == 2
    entries = ledger.entries("ann", limit=100).entries
    assert [e.amount_micros for e in entries if e.kind == "charge"] == [-charge]
    assert not [e for e in entries if e.kind == "refund"]
    assert spent == charge
    request = ledger.find_request("ann/once")
    assert request is not None and str(request.status) == "served"
    assert ledger.balance("ann").held_micros == 0
    assert ledger.reconcile().ok
