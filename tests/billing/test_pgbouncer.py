"""The ledger through PgBouncer in session mode, as docs/guides/postgresql.md sets it up.

Session mode, because the ledger needs what a session keeps: the jobs' leader election holds
a session-level advisory lock, and psycopg prepares the statements it runs often on the
connection it has (PgBouncer 1.18, Debian 12's, does not carry prepared statements across
the server connections of transaction mode).

PgBouncer (Debian's package) runs on a free port in front of the test's PostgreSQL schema; a
real server serves bids through it with the jobs' leader election on and a small pool
(`database_pool_size`, `database_max_overflow`). Skipped without `pgbouncer`, unless
INFERENCE_AUCTION_REQUIRE_PGBOUNCER=1 (CI), which fails instead.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import psycopg
import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url

from inference_auctions.billing import Ledger
from inference_auctions.server.settings import ServerSettings
from tests.db_fixtures import MigratedDatabase, dml_role, migrated_database
from tests.processes import free_port
from tests.server.harness import TEST_SETTINGS, serve_app

pytestmark = pytest.mark.postgres


def _pgbouncer() -> str:
    path = shutil.which("pgbouncer") or (
        "/usr/sbin/pgbouncer" if Path("/usr/sbin/pgbouncer").exists() else None
    )
    if path is None:
        message = "pgbouncer not installed (apt-get install pgbouncer)"
        if os.environ.get("INFERENCE_AUCTION_REQUIRE_PGBOUNCER") == "1":
            pytest.fail(message + " (INFERENCE_AUCTION_REQUIRE_PGBOUNCER=1)", pytrace=False)
        pytest.skip(message)
    return path


@pytest.fixture
def postgres_db(tmp_path: Path) -> Iterator[MigratedDatabase]:
    with migrated_database("postgres", tmp_path) as db:
        yield db


@pytest.fixture
def bouncer_role(postgres_db: MigratedDatabase) -> Iterator[str]:
    """The server's login role, its search path the test's schema: PgBouncer passes no
    `options` startup parameter on, so the schema cannot travel in the URL."""
    schema = str(make_url(postgres_db.url).query["options"]).split("=", 1)[1]
    with dml_role(postgres_db, "bouncer") as role:
        with postgres_db.engine.begin() as connection:
            connection.execute(text(f"ALTER ROLE {role} SET search_path TO {schema}"))
        yield role


def _start(config: Path, folder: Path) -> subprocess.Popen[bytes]:
    command = [_pgbouncer()]
    if os.geteuid() == 0:  # PgBouncer refuses to run as root
        command += ["-u", "nobody"]
    with (folder / "stderr").open("wb") as stderr:  # the child keeps its own descriptor
        return subprocess.Popen([*command, str(config)], stderr=stderr)


@pytest.fixture
def pgbouncer(postgres_db: MigratedDatabase, bouncer_role: str) -> Iterator[str]:
    """PgBouncer in session mode on a free port; yields the server's URL through it."""
    backend = make_url(postgres_db.url)
    port = free_port()
    # Not pytest's tmp_path: PgBouncer runs as `nobody` under root and must read and write here.
    folder = Path(tempfile.mkdtemp(prefix="pgbouncer-"))
    folder.chmod(0o777)
    config = folder / "pgbouncer.ini"
    config.write_text(
        "[databases]\n"
        f"ledger = host={backend.host} port={backend.port or 5432} dbname={backend.database}"
        f" user={bouncer_role}\n"
        "[pgbouncer]\n"
        f"listen_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\n"
        "auth_type = any\npool_mode = session\n"
        "default_pool_size = 10\nmax_client_conn = 50\n"
        f"admin_users = {bouncer_role}\n"
        f"logfile = {folder / 'pgbouncer.log'}\npidfile = {folder / 'pgbouncer.pid'}\n"
    )
    config.chmod(0o644)
    process = _start(config, folder)
    deadline = time.monotonic() + 10
    while True:
        try:
            psycopg.connect(_conninfo(port, bouncer_role, "ledger"), connect_timeout=2).close()
            break
        except psycopg.OperationalError:
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(
                    "pgbouncer did not start: " + (folder / "stderr").read_text()
                ) from None
            time.sleep(0.1)
    try:
        yield f"postgresql+psycopg://{bouncer_role}@127.0.0.1:{port}/ledger"
    finally:
        process.terminate()
        process.wait(10)
        shutil.rmtree(folder, ignore_errors=True)


def _conninfo(port: int, user: str, dbname: str) -> str:
    return f"host=127.0.0.1 port={port} user={user} dbname={dbname}"


def _transactions_through(url: str) -> int:
    """PgBouncer's count of transactions it passed to the ledger database (`SHOW STATS`)."""
    parsed = make_url(url)
    assert parsed.port is not None and parsed.username is not None
    with psycopg.connect(
        _conninfo(parsed.port, parsed.username, "pgbouncer"), autocommit=True
    ) as console:
        # The admin console speaks the simple query protocol only.
        result = console.pgconn.exec_(b"SHOW STATS")
        names = [result.fname(i) for i in range(result.nfields)]
        for row in range(result.ntuples):
            cells = (result.get_value(row, i) for i in range(result.nfields))
            values = dict(zip(names, cells, strict=True))
            if values[b"database"] == b"ledger":
                return int(values[b"total_xact_count"] or 0)
    return 0


def test_a_server_serves_bids_through_pgbouncer_in_session_mode(
    postgres_db: MigratedDatabase, pgbouncer: str
) -> None:
    settings = ServerSettings(
        **{
            **TEST_SETTINGS,
            "database_url": pgbouncer,
            "database_pool_size": 2,
            "database_max_overflow": 1,
            "run_jobs": True,
            "jobs_leader_election": True,  # a session-level advisory lock, through PgBouncer
            "batch_size": 4,
        }
    )
    books = Ledger(postgres_db.new_engine())
    users = ("ann", "ben", "cy")
    keys = {user: books.create_user(user, budget_micros=50_000_000).api_key for user in users}
    before = _transactions_through(pgbouncer)
    with serve_app(settings) as url:

        def bid(i: int) -> httpx.Response:
            user = users[i % 3]
            return httpx.post(
                url + "/generate",
                json={
                    "text": f"prompt {i} " * 8,
                    "bid": f"0.{i % 9 + 1}",
                    "sampling_params": {"max_new_tokens": 4},
                },
                headers={"Authorization": f"Bearer {keys[user]}"},
                timeout=60,
            )

        with ThreadPoolExecutor(12) as pool:
            replies = list(pool.map(bid, range(36)))
        assert all(reply.status_code == 200 for reply in replies), [r.text for r in replies]
        health = httpx.get(url + "/health", timeout=10).json()
        assert health["ledger"] == "ok"
    # Every batch settled through PgBouncer, and the books agree with the answers.
    assert _transactions_through(pgbouncer) - before >= 36 // 4
    assert books.reconcile().ok
    for index, user in enumerate(users):
        # What each answer says it paid: its charge and its part of the posted floor (on by
        # default; 36 requests at once raise it above 0).
        charged = sum(
            auction["request_charge_micros"] + auction.get("floor_micros", 0)
            for i, reply in enumerate(replies)
            if i % 3 == index
            for auction in [reply.json()["meta_info"]["auction"]]
        )
        balance = books.balance(user)
        assert balance.held_micros == 0
        assert balance.spent_this_period_micros == charged


def test_the_pool_size_settings_reach_the_engine(postgres_db: MigratedDatabase) -> None:
    with Ledger.from_url(postgres_db.url, pool_size=3, max_overflow=2) as ledger:
        pool = ledger.engine.pool
        assert (pool.size(), pool._max_overflow) == (3, 2)  # type: ignore[attr-defined]
    with Ledger.from_url(postgres_db.url) as ledger:  # SQLAlchemy's own: 5 and 10
        pool = ledger.engine.pool
        assert (pool.size(), pool._max_overflow) == (5, 10)  # type: ignore[attr-defined]
