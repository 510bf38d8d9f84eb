"""Database faults against the real auction server: the ledger is locked, or unreachable.

SQLite: another connection holds `BEGIN EXCLUSIVE`. Shorter than the busy timeout, requests
just wait; longer, they get a 503. PostgreSQL: the server's login role is refused new
connections and its open ones are terminated, then it may log in again. In every case a client
gets its result or a clear 503 (never a 500 or a traceback), nothing is half-written, the
server serves again once the database is back, and the ledger reconciles.
"""

from __future__ import annotations

import logging
import sqlite3
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url

from inference_auctions.billing import Ledger
from inference_auctions.billing import database as ledger_database
from inference_auctions.server.serving.clearing import refund_rule
from inference_auctions.server.settings import ServerSettings
from tests.billing.helpers import get_hold
from tests.db_fixtures import MigratedDatabase, dml_role, migrated_database
from tests.server.harness import TEST_SETTINGS, serve_app
from tests.server.money_audit import audit_money_against_answers

GRANT = 10_000_000
BID = "0.3"


def _wait_until(condition: Callable[[], object], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.02)


def _generate(
    url: str, key: str, rid: str, text_: str = "a question", **extra: Any
) -> httpx.Response:
    body = {"text": text_, "bid": BID, "rid": rid, "sampling_params": {"max_new_tokens": 4}}
    with httpx.Client(base_url=url, timeout=30) as client:
        return client.post(
            "/generate", headers={"Authorization": f"Bearer {key}"}, json=body | extra
        )


def _assert_unavailable(reply: httpx.Response, fragment: str) -> None:
    """A clear 503: the JSON error shape, a message that names the ledger, no traceback."""
    assert reply.status_code == 503, reply.text
    error = reply.json()["error"]
    assert error["type"] == "unavailable"
    assert fragment in error["message"]
    assert "Traceback" not in reply.text


@contextmanager
def _server(
    database_url: str, test_engine_db: MigratedDatabase, **overrides: Any
) -> Iterator[tuple[str, Ledger]]:
    settings = ServerSettings(database_url=database_url, **{**TEST_SETTINGS, **overrides})
    ledger = Ledger(test_engine_db.new_engine())
    with serve_app(settings) as url:
        yield url, ledger


# SQLite: a lock held by another connection


@pytest.fixture
def sqlite_db(tmp_path: Path) -> Iterator[MigratedDatabase]:
    with migrated_database("sqlite", tmp_path) as db:
        yield db


@contextmanager
def _exclusive_lock(db: MigratedDatabase) -> Iterator[None]:
    """Another process's write transaction: no writer gets in until the block ends."""
    path = make_url(db.url).database
    assert path is not None
    connection = sqlite3.connect(path, isolation_level=None, timeout=5)
    try:
        connection.execute("BEGIN EXCLUSIVE")
        yield
        connection.execute("ROLLBACK")
    finally:
        connection.close()


def test_a_briefly_locked_sqlite_ledger_only_delays_requests(sqlite_db: MigratedDatabase) -> None:
    with _server(sqlite_db.url, sqlite_db, batch_size=2, max_wait_ms=2_000) as (url, ledger):
        keys = {u: ledger.create_user(u, budget_micros=GRANT).api_key for u in ("ann", "ben")}
        with ThreadPoolExecutor(2) as pool:
            with _exclusive_lock(sqlite_db):
                started = time.monotonic()
                replies = [pool.submit(_generate, url, keys[u], f"{u}-1") for u in keys]
                time.sleep(0.6)
                assert not any(r.done() for r in replies), "the writers wait for the lock"
            results = [r.result(timeout=30) for r in replies]
        assert [r.status_code for r in results] == [200, 200], [r.text for r in results]
        assert time.monotonic() - started >= 0.6
        assert results[0].json()["meta_info"]["auction"]["batch_size"] == 2
        for user in keys:
            assert ledger.balance(user).held_micros == 0
        assert ledger.reconcile().ok


def test_a_sqlite_lock_past_the_busy_timeout_is_503_and_writes_nothing(
    sqlite_db: MigratedDatabase, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The server waits this long for the lock (30 s by default) before giving up.
    monkeypatch.setattr(ledger_database, "SQLITE_BUSY_TIMEOUT_S", 0.4)
    with _server(sqlite_db.url, sqlite_db, batch_size=2, max_wait_ms=1_500) as (url, ledger):
        keys = {u: ledger.create_user(u, budget_micros=GRANT).api_key for u in ("ann", "ben")}
        with ThreadPoolExecutor(2) as pool:
            # ann's hold is placed; her request waits in the pool for a second request.
            caught = pool.submit(_generate, url, keys["ann"], "caught")
            _wait_until(lambda: get_hold(ledger, "ann/caught") is not None)
            with _exclusive_lock(sqlite_db):
                # ben cannot place a hold; ann's batch closes alone and cannot be settled.
                refused = _generate(url, keys["ben"], "refused")
                settle_failed = caught.result(timeout=30)
        _assert_unavailable(refused, "ledger is unavailable")
        assert refused.headers["retry-after"] == "1"
        _assert_unavailable(settle_failed, "could not settle the batch; nothing was charged")

        # Nothing of either request was written: no hold for ben, no batch, no charge.
        assert get_hold(ledger, "ben/refused") is None
        assert ledger.find_request("ann/caught") is None
        hold = get_hold(ledger, "ann/caught")
        assert hold is not None and str(hold.state) == "open"  # releasing it failed as well
        assert ledger.balance("ann").held_micros == 300_000
        assert [e.kind for e in ledger.entries("ann").entries] == ["grant", "hold"]
        assert ledger.reconcile().ok

        # The lock is gone: new requests are served, and ann's retry uses its open hold.
        with ThreadPoolExecutor(2) as pool:
            retry = pool.submit(_generate, url, keys["ann"], "caught")
            fresh = pool.submit(_generate, url, keys["ben"], "fresh", "another question")
            assert retry.result(timeout=30).status_code == 200, retry.result().text
            assert fresh.result(timeout=30).status_code == 200, fresh.result().text
        for user in keys:
            balance = ledger.balance(user)
            assert balance.held_micros == 0
            assert balance.balance_micros <= GRANT
        assert str(get_hold(ledger, "ann/caught").state) == "settled"  # type: ignore[union-attr]
        holds = [e for e in ledger.entries("ann").entries if e.kind == "hold"]
        assert len(holds) == 1, "the retry reused the hold placed before the lock"
        assert ledger.reconcile().ok


def test_a_ledger_locked_when_requests_complete_answers_503_and_refunds_later(
    sqlite_db: MigratedDatabase, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The batch settles; while its requests are at the engine (about a second of real-time
    # emulation) the ledger is locked past the busy timeout, so their outcomes cannot be
    # recorded. No client may get a 200 for an answer the ledger does not know was served.
    monkeypatch.setattr(ledger_database, "SQLITE_BUSY_TIMEOUT_S", 0.4)
    with _server(
        sqlite_db.url, sqlite_db, batch_size=2, max_wait_ms=2_000, emulator_time_scale=1.0
    ) as (url, ledger):
        keys = {u: ledger.create_user(u, budget_micros=GRANT).api_key for u in ("ann", "ben")}
        bids = {"ann": "0.5", "ben": "0.2"}
        with ThreadPoolExecutor(2) as pool:
            replies = [
                pool.submit(
                    _generate,
                    url,
                    keys[u],
                    f"{u}-late",
                    f"{u} asks a long question",
                    bid=bids[u],
                    sampling_params={"max_new_tokens": 40},
                )
                for u in keys
            ]
            _wait_until(lambda: all(ledger.find_request(f"{u}/{u}-late") for u in keys))
            with _exclusive_lock(sqlite_db):
                results = [r.result(timeout=30) for r in replies]
        for reply in results:
            _assert_unavailable(reply, "could not be recorded")
            assert reply.headers["retry-after"] == "1"
        charged = {u: GRANT - ledger.balance(u).balance_micros for u in keys}
        assert sum(charged.values()) > 0
        for user in keys:
            request = ledger.find_request(f"{user}/{user}-late")
            assert request is not None and str(request.status) == "scheduled"

        # Later, the documented recovery refunds exactly those charges.
        refunds = ledger.refund_unserved(timedelta(0), rule=refund_rule)
        assert sorted((r.user, r.amount_micros) for r in refunds) == sorted(
            (u, c) for u, c in charged.items() if c
        )
        for user in keys:
            assert ledger.balance(user).balance_micros == GRANT
            assert str(ledger.find_request(f"{user}/{user}-late").status) == "failed"  # type: ignore[union-attr]
        assert ledger.reconcile().ok


# PostgreSQL: the server cannot connect


@pytest.fixture
def postgres_db(tmp_path: Path) -> Iterator[MigratedDatabase]:
    with migrated_database("postgres", tmp_path) as db:
        yield db


@pytest.fixture
def server_role(postgres_db: MigratedDatabase) -> Iterator[str]:
    """A login role of the server's own, with what the ledger needs on the test's schema."""
    with dml_role(postgres_db, "fault") as role:
        yield role


@contextmanager
def _unreachable(db: MigratedDatabase, role: str) -> Iterator[None]:
    """The role may not log in and its sessions are gone, until the block ends."""
    with db.engine.begin() as connection:
        connection.execute(text(f"ALTER ROLE {role} NOLOGIN"))
        connection.execute(
            text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = :r"),
            {"r": role},
        )
    try:
        yield
    finally:
        with db.engine.begin() as connection:
            connection.execute(text(f"ALTER ROLE {role} LOGIN"))


@pytest.mark.postgres
def test_an_unreachable_postgres_ledger_is_503_until_it_is_back(
    postgres_db: MigratedDatabase, server_role: str
) -> None:
    server_url = make_url(postgres_db.url).set(username=server_role).render_as_string(False)
    with _server(server_url, postgres_db, batch_size=2, max_wait_ms=1_500) as (url, ledger):
        keys = {u: ledger.create_user(u, budget_micros=GRANT).api_key for u in ("ann", "ben", "cy")}
        with ThreadPoolExecutor(2) as pool:
            warm = [
                pool.submit(_generate, url, keys[u], "warm", f"hello {u}") for u in ("ann", "ben")
            ]
            assert [w.result(timeout=30).status_code for w in warm] == [200, 200]
            caught = pool.submit(_generate, url, keys["ben"], "caught")
            _wait_until(lambda: get_hold(ledger, "ben/caught") is not None)
            with _unreachable(postgres_db, server_role):
                # cy's key was never seen, so reading it fails; ann's may still be cached, so
                # her hold fails instead. Either way: a 503.
                during = {
                    "ann": _generate(url, keys["ann"], "during"),
                    "cy": _generate(url, keys["cy"], "during"),
                }
                with httpx.Client(base_url=url, timeout=30) as client:
                    balance = client.get(
                        "/v1/ledger/balance", headers={"Authorization": f"Bearer {keys['ann']}"}
                    )
                    health = client.get("/health")
                settle_failed = caught.result(timeout=30)
        # The failed settlement is counted where an operator's alert can see it.
        metrics = httpx.get(url + "/metrics", timeout=30).text
        assert 'inference_auction_ledger_errors_total{operation="settle"} 1.0' in metrics
        # The health check names what is down, so an orchestrator can route around it.
        assert health.status_code == 503
        assert health.json()["ledger"] == "unavailable"
        assert health.json()["status"] == "ledger unavailable"
        for reply in [*during.values(), balance, settle_failed]:
            assert reply.headers["retry-after"] == "1"
        for reply in during.values():
            _assert_unavailable(reply, "ledger")
        _assert_unavailable(balance, "ledger")
        _assert_unavailable(settle_failed, "could not settle the batch; nothing was charged")

        # Nothing was half-written: no hold for the refused requests, no batch for ben's.
        assert get_hold(ledger, "ann/during") is None and get_hold(ledger, "cy/during") is None
        assert ledger.find_request("ben/caught") is None
        assert str(get_hold(ledger, "ben/caught").state) == "open"  # type: ignore[union-attr]
        assert ledger.reconcile().ok

        # Back: the same requests are served, ben's retry with its open hold.
        with ThreadPoolExecutor(3) as pool:
            again = [
                pool.submit(_generate, url, keys["ann"], "during"),
                pool.submit(_generate, url, keys["cy"], "during"),
                pool.submit(_generate, url, keys["ben"], "caught"),
            ]
            assert [a.result(timeout=30).status_code for a in again] == [200, 200, 200]
        for user in keys:
            assert ledger.balance(user).held_micros == 0
        ben_holds = [e for e in ledger.entries("ben").entries if e.kind == "hold"]
        assert len(ben_holds) == 2, "warm and caught, the retry reusing the open hold"
        assert ledger.reconcile().ok


def test_health_says_when_the_sqlite_ledger_cannot_write(
    sqlite_db: MigratedDatabase, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Before: /health read the ledger (which a write lock does not stop) and said ok while
    # every commit failed.
    monkeypatch.setattr(ledger_database, "SQLITE_BUSY_TIMEOUT_S", 0.4)
    with _server(sqlite_db.url, sqlite_db) as (url, ledger):
        key = ledger.create_user("ann", budget_micros=GRANT).api_key
        assert httpx.get(f"{url}/health").status_code == 200
        with _exclusive_lock(sqlite_db):
            _assert_unavailable(_generate(url, key, "locked"), "ledger is unavailable")
            health = httpx.get(f"{url}/health")
            assert health.status_code == 503, health.text
            assert health.json()["ledger"].startswith("cannot write")
            assert "SELECT" not in health.text and "INSERT" not in health.text
        served = _generate(url, key, "after")
        assert served.status_code == 200, served.text
        assert httpx.get(f"{url}/health").status_code == 200
        assert ledger.find_request("ann/locked") is None
        assert str(ledger.find_request("ann/after").status) == "served"  # type: ignore[union-attr]
        assert ledger.balance("ann").held_micros == 0
        assert ledger.reconcile().ok


@contextmanager
def _read_only(db: MigratedDatabase, role: str) -> Iterator[None]:
    """The role may read the ledger but not write it (its write privileges revoked, which
    counts at once on its open connections too), until the block ends."""
    schema = str(make_url(db.url).query["options"]).split("=", 1)[1]
    tables = f"ALL TABLES IN SCHEMA {schema}"
    with db.engine.begin() as connection:
        connection.execute(text(f"REVOKE INSERT, UPDATE, DELETE ON {tables} FROM {role}"))
    try:
        yield
    finally:
        with db.engine.begin() as connection:
            connection.execute(text(f"GRANT INSERT, UPDATE, DELETE ON {tables} TO {role}"))


@pytest.mark.postgres
def test_health_says_when_the_postgres_ledger_cannot_write(
    postgres_db: MigratedDatabase, server_role: str
) -> None:
    # Before (as on SQLite): /health read the ledger, which a database refusing writes still
    # answers, and said ok while every commit failed.
    server_url = make_url(postgres_db.url).set(username=server_role).render_as_string(False)
    with _server(server_url, postgres_db) as (url, ledger):
        key = ledger.create_user("ann", budget_micros=GRANT).api_key
        assert httpx.get(f"{url}/health").status_code == 200
        with _read_only(postgres_db, server_role):
            _assert_unavailable(_generate(url, key, "refused"), "ledger is unavailable")
            health = httpx.get(f"{url}/health")
            assert health.status_code == 503, health.text
            assert health.json()["ledger"].startswith("cannot write")
            assert "INSERT" not in health.text and "permission" not in health.text
        served = _generate(url, key, "after")
        assert served.status_code == 200, served.text
        assert httpx.get(f"{url}/health").status_code == 200
        assert ledger.find_request("ann/refused") is None
        assert get_hold(ledger, "ann/refused") is None
        assert str(ledger.find_request("ann/after").status) == "served"  # type: ignore[union-attr]
        assert ledger.balance("ann").held_micros == 0
        assert ledger.reconcile().ok


def _terminate_sessions(db: MigratedDatabase, role: str) -> int:
    with db.engine.begin() as connection:
        return int(
            connection.scalar(
                text(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                    " WHERE usename = :r"
                ),
                {"r": role},
            )
        )


def _connection_lines(caplog: pytest.LogCaptureFixture, *phrases: str) -> list[logging.LogRecord]:
    """The records that say a connection was lost (any of `phrases`); fails on any ERROR,
    traceback or psycopg's second line for the same loss."""
    loud = [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]
    assert not loud, [r.getMessage() for r in loud]
    assert not [r for r in caplog.records if "error ignored terminating" in r.getMessage()]
    lost = [r for r in caplog.records if any(p in r.getMessage() for p in phrases)]
    assert all(r.levelno == logging.WARNING and "\n" not in r.getMessage() for r in lost)
    return lost


@pytest.mark.postgres
def test_dead_postgres_connections_of_requests_are_replaced_with_a_warning(
    postgres_db: MigratedDatabase, server_role: str, caplog: pytest.LogCaptureFixture
) -> None:
    # Before: a connection the database closed was replaced in silence, with psycopg's
    # "error ignored terminating <Pipeline>" lines under load; earlier, ERROR tracebacks.
    caplog.set_level(logging.WARNING)
    server_url = make_url(postgres_db.url).set(username=server_role).render_as_string(False)
    with _server(server_url, postgres_db, batch_size=4, max_wait_ms=20) as (url, ledger):
        keys = {u: ledger.create_user(u, budget_micros=GRANT).api_key for u in ("ann", "ben")}
        outcomes: dict[str, str] = {}

        def wave(tag: str, count: int) -> None:
            """Requests of both users at once; one whose commit was cut off by a lost
            connection is a 503 (the ledger cannot know whether it committed) and is served
            when its client retries it with the same rid, charged once."""
            with ThreadPoolExecutor(4) as pool:
                replies = {
                    (user, f"{tag}{i}"): pool.submit(_generate, url, keys[user], f"{tag}{i}")
                    for user in keys
                    for i in range(count)
                }
                for (user, rid), reply in replies.items():
                    answer = reply.result(timeout=30)
                    if answer.status_code == 503:
                        answer = _generate(url, keys[user], rid)
                    assert answer.status_code == 200, (user, rid, answer.text)
                    outcomes[f"{user}/{rid}"] = "served"

        wave("warm", 2)
        assert _terminate_sessions(postgres_db, server_role) > 0  # idle, in the pool
        wave("after", 2)
        assert _connection_lines(caplog, "closed by the database")

        def kill_soon() -> int:
            time.sleep(0.2)
            return _terminate_sessions(postgres_db, server_role)

        caplog.clear()
        with ThreadPoolExecutor(1) as killer:
            killed = killer.submit(kill_soon)
            wave("load", 8)  # under load
            assert killed.result() > 0
        assert httpx.get(f"{url}/health").status_code == 200
        audit_money_against_answers(ledger, outcomes)
    # Under load the loss may cut a commit off: then the request or the batch it failed says so
    # (its clients got 503 and retried).
    assert _connection_lines(caplog, "closed by the database", "the ledger is unavailable")


@pytest.mark.postgres
def test_a_dead_postgres_connection_of_a_ledger_job_is_a_warning(
    postgres_db: MigratedDatabase, server_role: str, caplog: pytest.LogCaptureFixture
) -> None:
    # Before: a job that found its connection dead left APScheduler's ERROR traceback
    # "Job ... raised an exception".
    caplog.set_level(logging.WARNING)
    server_url = make_url(postgres_db.url).set(username=server_role).render_as_string(False)
    # The rollover job alone runs often, so that it is what finds the connection dead.
    jobs = {
        "run_jobs": True,
        "rollover_interval_seconds": 0.2,
        "hold_expiry_interval_seconds": 3600,
    }
    with _server(server_url, postgres_db, **jobs) as (url, ledger):
        key = ledger.create_user("ann", budget_micros=GRANT).api_key
        assert _generate(url, key, "before").status_code == 200
        time.sleep(0.5)  # the job has run, and its connection waits in the pool
        assert _terminate_sessions(postgres_db, server_role) > 0
        time.sleep(0.6)
        assert _generate(url, key, "after").status_code == 200
        audit_money_against_answers(ledger, {"ann/before": "served", "ann/after": "served"})
    assert _connection_lines(caplog, "did not run: ", "closed by the database")


# An idle server: no request comes, so no commit can fail. Its heartbeat writes on a schedule.
_BEAT = {"ledger_heartbeat_seconds": 0.2}


def _health_while_idle(url: str) -> httpx.Response:
    """/health once it says the ledger cannot write (a few heartbeats), or its last answer."""
    deadline = time.monotonic() + 10
    while True:
        health = httpx.get(f"{url}/health")
        if health.status_code == 503 or time.monotonic() > deadline:
            return health
        time.sleep(0.1)


def test_health_of_an_idle_server_says_when_the_sqlite_ledger_cannot_write(
    sqlite_db: MigratedDatabase, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Before: /health read the ledger and asked whether the last commit had failed; with no
    # request there was no commit, and it said ok while nothing could be written.
    monkeypatch.setattr(ledger_database, "SQLITE_BUSY_TIMEOUT_S", 0.4)
    with _server(sqlite_db.url, sqlite_db, **_BEAT) as (url, _):
        assert httpx.get(f"{url}/health").status_code == 200
        with _exclusive_lock(sqlite_db):
            health = _health_while_idle(url)
            assert health.status_code == 503, health.text
            assert health.json()["ledger"].startswith("cannot write: its heartbeat write failed")
            assert "UPDATE" not in health.text and "INSERT" not in health.text
        _wait_until(lambda: httpx.get(f"{url}/health").status_code == 200)


@pytest.mark.postgres
def test_health_of_an_idle_server_says_when_the_postgres_ledger_cannot_write(
    postgres_db: MigratedDatabase, server_role: str
) -> None:
    server_url = make_url(postgres_db.url).set(username=server_role).render_as_string(False)
    with _server(server_url, postgres_db, **_BEAT) as (url, _):
        assert httpx.get(f"{url}/health").status_code == 200
        with _read_only(postgres_db, server_role):
            health = _health_while_idle(url)
            assert health.status_code == 503, health.text
            assert health.json()["ledger"].startswith("cannot write: its heartbeat write failed")
            assert "UPDATE" not in health.text and "permission" not in health.text
        _wait_until(lambda: httpx.get(f"{url}/health").status_code == 200)
