"""A pooled connection that died while idle costs no failed call: the ledger finds out on its
first statement and runs the transaction again on a fresh connection, since nothing of it
committed. One that dies while committing is not run again: its outcome is unknown.

PostgreSQL only: SQLite has no server to lose. The backends are terminated with
`pg_terminate_backend`, as a restart of the database server or an idle timeout would.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, event, text

from inference_auctions.billing import (
    ClaimedBatch,
    HoldInput,
    Ledger,
    LedgerUnavailable,
    RequestStatus,
    ServedInput,
)
from inference_auctions.billing.request_log import serve_one
from tests.billing.helpers import claim_of
from tests.db_fixtures import MigratedDatabase, migrated_database

pytestmark = pytest.mark.postgres


@pytest.fixture
def postgres_db(tmp_path: Path) -> Iterator[MigratedDatabase]:
    with migrated_database("postgresql", tmp_path) as db:
        yield db


def _terminate_pooled(db: MigratedDatabase, engine: Engine) -> int:
    """Terminate the server side of every connection `engine`'s pool holds; how many."""
    pids = [
        record.dbapi_connection.info.backend_pid
        for record in list(engine.pool._pool.queue)  # type: ignore[attr-defined]
    ]
    with db.new_engine().begin() as admin:
        for pid in pids:
            admin.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})
    return len(pids)


def test_the_engine_does_not_ping_every_checkout(postgres_db: MigratedDatabase) -> None:
    assert not postgres_db.engine.pool._pre_ping  # type: ignore[attr-defined]


def test_a_write_and_a_read_on_dead_pooled_connections_succeed_once(
    postgres_db: MigratedDatabase,
) -> None:
    ledger = Ledger(postgres_db.engine)
    ledger.create_user("ada", budget_micros=1_000)
    assert ledger.balance("ada").balance_micros == 1_000  # a pooled connection now exists
    assert _terminate_pooled(postgres_db, postgres_db.engine) >= 1
    [held] = ledger.place_holds([HoldInput("ada", "r1", 300)])
    assert held.amount_micros == 300
    assert _terminate_pooled(postgres_db, postgres_db.engine) >= 1
    balance = ledger.balance("ada")
    assert (balance.balance_micros, balance.held_micros) == (1_000, 300)  # held once
    assert ledger.reconcile().ok


def test_a_connection_lost_while_committing_is_not_run_again(
    postgres_db: MigratedDatabase,
) -> None:
    ledger = Ledger(postgres_db.engine)
    ledger.create_user("ada", budget_micros=1_000)
    commits = 0

    def die_before_commit(connection: Any) -> None:
        nonlocal commits
        commits += 1
        pid = connection.connection.dbapi_connection.info.backend_pid
        with postgres_db.new_engine().begin() as admin:
            admin.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})

    event.listen(postgres_db.engine, "commit", die_before_commit)
    try:
        with pytest.raises(LedgerUnavailable):
            ledger.place_holds([HoldInput("ada", "r1", 300)])
    finally:
        event.remove(postgres_db.engine, "commit", die_before_commit)
    assert commits == 1
    assert ledger.balance("ada").held_micros == 0  # the server rolled it back


def test_a_lone_served_record_on_a_dead_pooled_connection_is_recorded_once(
    postgres_db: MigratedDatabase,
) -> None:
    ledger = Ledger(postgres_db.engine)
    ledger.create_user("ada", budget_micros=1_000)
    outcome = ledger.commit_group(
        [HoldInput("ada", "r1", 300)], [], [claim_of("b1", {"r1": ("ada", 300)}, 100)]
    )
    assert isinstance(outcome.claimed[0], ClaimedBatch)
    assert _terminate_pooled(postgres_db, postgres_db.engine) >= 1
    # One statement in autocommit mode: its retry asks whether the lost attempt served it.
    assert ledger.commit_group([], [ServedInput("r1", None, 2.0)], []).served == [True]
    found = ledger.find_request("r1")
    assert found is not None and found.status is RequestStatus.SERVED
    assert ledger.record_served_many([ServedInput("r1", None, 2.0)]) == [False]  # once
    assert ledger.reconcile().ok


def test_a_served_statement_tried_again_finds_what_the_lost_attempt_did(
    postgres_db: MigratedDatabase,
) -> None:
    ledger = Ledger(postgres_db.engine)
    ledger.create_user("ada", budget_micros=1_000)
    for rid in ("served", "failed", "waiting"):
        ledger.commit_group(
            [HoldInput("ada", rid, 300)], [], [claim_of(f"b-{rid}", {rid: ("ada", 300)}, 0)]
        )
    assert ledger.record_served_many([ServedInput("served", None, None)]) == [True]
    ledger.record_failed("failed", "b-failed", "ada", target_micros=0, reason="engine: down")
    now = datetime.now(UTC)
    engine = postgres_db.engine.execution_options(isolation_level="AUTOCOMMIT")
    with engine.connect() as connection:
        again = [
            serve_one(connection, ServedInput(rid, None, None), now, again=True)
            for rid in ("served", "failed", "waiting")
        ]
        first_try = serve_one(connection, ServedInput("served", None, None), now)
    # Served before: by the lost attempt, so the answer may go; failed: recovery was first;
    # still scheduled: served now. A first attempt that finds it served did not serve it.
    assert again == [True, False, True]
    assert first_try is False
