"""Two replicas on one PostgreSQL ledger: per-key rate limits for the whole deployment, the
periodic jobs running on both at once, and one rid sent to both replicas."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest
from sqlalchemy import Engine, text

from inference_auctions.billing import Ledger
from inference_auctions.billing.jobs import run_hold_expiry, run_reconcile, run_rollover
from inference_auctions.billing.leadership import JobLeadership, start_jobs
from inference_auctions.server.settings import ServerSettings
from tests.billing.conftest import Clock
from tests.cluster.helpers import charges_by_batch, generate, wait_until
from tests.db_fixtures import MigratedDatabase, migrated_database
from tests.server.harness import running_server

pytestmark = [pytest.mark.postgres, pytest.mark.timeout(120)]


def _balance_call(url: str, key: str) -> httpx.Response:
    return httpx.get(url + "/v1/ledger/balance", headers={"Authorization": f"Bearer {key}"})


def test_a_keys_rate_limit_holds_for_the_deployment_not_per_replica(
    postgres_db: MigratedDatabase,
) -> None:
    # Burst 4 for the deployment, refilling so slowly that nothing comes back during the test;
    # each of the two replicas enforces its share, 2.
    limits = {"rate_limit_per_second": 0.001, "rate_limit_burst": 4, "rate_limit_replicas": 2}
    with ExitStack() as stack:
        a, b = (stack.enter_context(running_server(postgres_db, **limits)) for _ in range(2))
        spread = a.create_user("spread")
        alternating = [_balance_call(server.url, spread) for server in (a, b) * 5]
        statuses = [reply.status_code for reply in alternating]
        assert statuses.count(200) == 4, statuses  # the deployment's burst, not 2 x 4
        assert statuses[:4] == [200] * 4 and set(statuses[4:]) == {429}, statuses
        refused = alternating[-1]
        assert refused.json()["error"]["type"] == "rate_limited"
        assert int(refused.headers["retry-after"]) >= 1
        # A key whose requests all reach one replica gets that replica's share: never more
        # than the deployment's limit, however the router spreads the key.
        sticky = a.create_user("sticky")
        statuses = [_balance_call(a.url, sticky).status_code for _ in range(4)]
        assert statuses == [200, 200, 429, 429], statuses


def test_two_replicas_running_the_ledger_jobs_at_once_do_each_thing_once(
    postgres_db: MigratedDatabase,
) -> None:
    clock = Clock(datetime(2025, 1, 15, 12, 0, tzinfo=UTC))
    replicas = [Ledger(postgres_db.new_engine(), clock=clock) for _ in range(2)]
    admin = replicas[0]
    users = [f"user-{i}" for i in range(6)]
    for name in users:
        admin.create_user(name, budget_micros=1_000, period="day")
        admin.place_hold(name, f"{name}/stale", 100)

    days = 3
    for _ in range(days):
        clock.advance(days=1)  # a period is due for everyone, and every open hold is stale
        for name in users:
            admin.place_hold(name, f"{name}/{clock.now.date()}", 10)
        clock.advance(hours=2)
        barrier = threading.Barrier(len(replicas))

        def jobs(ledger: Ledger, barrier: threading.Barrier = barrier) -> None:
            for job in (
                lambda: run_rollover(ledger),
                lambda: run_hold_expiry(ledger, timedelta(hours=1)),
                lambda: run_reconcile(ledger),
            ):
                barrier.wait(timeout=30)  # both replicas start each job together
                job()

        with ThreadPoolExecutor(len(replicas)) as pool:
            for done in [pool.submit(jobs, ledger) for ledger in replicas]:
                done.result(timeout=60)

    for name in users:
        entries = admin.entries(name, limit=1000).entries
        grants = [e for e in entries if str(e.kind) == "grant"]
        releases = [e for e in entries if str(e.kind) == "release"]
        holds = [e for e in entries if str(e.kind) == "hold"]
        assert len(grants) == 1 + days, [(e.kind, e.created_at) for e in grants]
        assert len(holds) == len(releases) == 1 + days  # each hold released exactly once
        assert admin.balance(name).held_micros == 0
    assert admin.reconcile().ok


def test_a_rid_already_settled_by_another_replica_fails_alone(
    postgres_db: MigratedDatabase,
) -> None:
    # Each replica's batch closes at two requests and never on time, so the test decides
    # when each batch clears and in which order.
    batching = {"batch_size": 2, "max_wait_ms": 600_000}
    with ExitStack() as stack:
        a, b = (stack.enter_context(running_server(postgres_db, **batching)) for _ in range(2))
        keys = {name: a.create_user(name) for name in ("alice", "bob", "carol")}
        pool = stack.enter_context(ThreadPoolExecutor(4))

        def queued(server_url: str) -> int:
            return int(httpx.get(server_url + "/health").json()["queue"])

        # alice's request reaches replica A, then (a retry, as SMG sends one after a timeout)
        # the same rid and payload reaches replica B; both wait in their replicas' pools.
        same = {"prompt": "alice's question", "rid": "retried", "bid": "0.4"}
        on_a = pool.submit(
            generate, a.url, keys["alice"], same["prompt"], rid=same["rid"], bid=same["bid"]
        )
        wait_until(lambda: queued(a.url) == 1, 15, "alice waiting on A")
        on_b = pool.submit(
            generate, b.url, keys["alice"], same["prompt"], rid=same["rid"], bid=same["bid"]
        )
        wait_until(lambda: queued(b.url) == 1, 15, "alice's retry waiting on B")
        # bob closes B's batch: B settles and serves alice's request.
        bob = generate(b.url, keys["bob"], "bob's question", bid="0.2")
        assert bob.status_code == 200, bob.text
        assert on_b.result(timeout=60).status_code == 200
        # carol closes A's batch, which still holds alice's request under the settled rid.
        carol = generate(a.url, keys["carol"], "carol's question", bid="0.3")
        first = on_a.result(timeout=60)

    assert carol.status_code == 200, carol.text  # another user's request never fails for it
    assert first.status_code >= 400, first.text  # alice's copy gets its own error
    assert first.json()["error"]["message"]
    charged = charges_by_batch(a.ledger, "alice")
    assert len(charged) <= 1  # served once, charged at most once
    assert a.ledger.balance("alice").held_micros == 0
    assert a.ledger.reconcile().ok


def test_one_replica_leads_the_jobs_and_another_takes_over_when_it_dies(
    postgres_db: MigratedDatabase,
) -> None:
    def engine_named(name: str) -> Engine:
        return postgres_db.new_engine(connect_args={"application_name": name})

    replicas = {name: JobLeadership(engine_named(name)) for name in ("lead-a", "lead-b")}
    with ThreadPoolExecutor(2) as pool:  # both ask at the same moment
        asked = dict(zip(replicas, pool.map(lambda j: j.held(), replicas.values()), strict=True))
    assert sorted(asked.values()) == [False, True], asked
    leader = next(name for name, held in asked.items() if held)
    other = next(name for name in replicas if name != leader)
    for _ in range(3):  # stable while the leader lives
        assert replicas[leader].held() and not replicas[other].held()

    # The leader dies (its session ends, as when its process is killed): the other one leads
    # from its next job on, and the old leader does not take the lock back.
    with postgres_db.engine.connect() as connection:
        connection.execute(
            text(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = :n"
            ),
            {"n": leader},
        )
    wait_until(replicas[other].held, 10, "the other replica took over")
    assert not replicas[leader].held()
    replicas[other].release()  # a graceful stop hands it back at once
    assert replicas[leader].held()
    replicas[leader].release()


def test_a_ledger_in_another_schema_elects_its_own_leader(tmp_path: Path) -> None:
    with (
        migrated_database("postgres", tmp_path / "one") as one,
        migrated_database("postgres", tmp_path / "two") as two,
    ):
        first, second = JobLeadership(one.new_engine()), JobLeadership(two.new_engine())
        assert first.held() and second.held()  # one PostgreSQL server, two deployments
        first.release()
        second.release()


def test_elected_jobs_still_release_stale_holds(postgres_db: MigratedDatabase) -> None:
    settings = ServerSettings(
        database_url=postgres_db.url,
        jobs_leader_election=True,
        hold_max_age_seconds=0.2,
        hold_expiry_interval_seconds=0.2,
    )
    ledgers = [Ledger(postgres_db.new_engine()) for _ in range(2)]
    ledgers[0].create_user("stale", budget_micros=1_000)
    ledgers[0].place_hold("stale", "stale/r", 100)
    jobs = [start_jobs(ledger, settings, leader_election=True) for ledger in ledgers]
    try:
        assert all(j.leadership is not None for j in jobs)
        wait_until(lambda: ledgers[0].balance("stale").held_micros == 0, 15, "hold released")
        releases = ledgers[0].entries("stale", kind="release").entries
        assert len(releases) == 1
        assert sum(bool(j.leadership and j.leadership.held()) for j in jobs) == 1
    finally:
        for j in jobs:
            j.shutdown(wait=True)
