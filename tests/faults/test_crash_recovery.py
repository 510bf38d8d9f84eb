"""SIGKILL of `inference-auction serve`, then a restart on the same PostgreSQL ledger.

In the middle of settling: three users' requests fill a batch; the test holds a row lock on two
of their holds, so the server's settlement transaction blocks halfway, after it has written the
batch row. The server is killed there. The batch must not have settled at all, the holds must
still be open (nothing charged, nothing lost), and after a restart the hold-expiry job must
release them, leaving every balance at its grant, the ledger reconciled, and the server
serving again.

While a batch sent to the engine ahead of its commit waits for that commit (the same lock):
the engine has answered, but no client gets a byte and nothing is settled or charged.

While requests are at the engine: their batch settled, so their users were charged, and the
process that would have refunded a failure is gone. The charges stay and the requests stay
`scheduled` until the recovery procedure of docs/OPERATIONS.md refunds them. A request whose
answer was sent before the kill was recorded `served` first: it keeps its charge, and the
recovery (run while a restarted server serves) refunds only the others, by the per-request
rule.
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path

import httpx
import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url

from inference_auctions.billing import Ledger
from inference_auctions.server.auction import AuctionRequest
from inference_auctions.server.auction.charges import PricingRule, Repricer
from inference_auctions.server.auction.rolling import rolling_share_refund
from tests.billing.helpers import get_hold
from tests.db_fixtures import MigratedDatabase, migrated_database
from tests.faults.faulty_sglang import FaultySGLang, token_ids
from tests.processes import free_port, wait_until_healthy

GRANT = 10_000_000
BIDS = {"alice": "0.5", "bob": "0.3", "carol": "0.2"}
CLI = [sys.executable, "-m", "inference_auctions.server.cli"]


def _wait_until(condition: Callable[[], object], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not reached within {timeout} s")
        time.sleep(0.05)


@pytest.fixture
def postgres_db(tmp_path: Path) -> Iterator[MigratedDatabase]:
    with migrated_database("postgres", tmp_path) as db:
        yield db


# The server restarted after a crash is the crashed replica again, under its name. It is
# another process, so it must clear under the dead one's pricing rule until that one's row
# lapses (`billing.replica_rules`): every server here prices against the same 8 slots,
# whatever its batch size.
RESTARTED = "crashed-and-restarted"
PRIORITY_SLOTS = 8


def _environment(database_url: str, port: int, **settings: object) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("INFERENCE_AUCTION_")}
    env["INFERENCE_AUCTION_DATABASE_URL"] = database_url
    env["INFERENCE_AUCTION_PORT"] = str(port)
    env["INFERENCE_AUCTION_EMULATOR_TIME_SCALE"] = "0.002"
    env["INFERENCE_AUCTION_PRIORITY_SLOTS"] = str(PRIORITY_SLOTS)
    for name, value in settings.items():
        env[f"INFERENCE_AUCTION_{name.upper()}"] = str(value)
    return env


@contextmanager
def _serve(env: dict[str, str], log: Path) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """`inference-auction serve` in its own process, until the block ends (or it is killed)."""
    url = f"http://127.0.0.1:{env['INFERENCE_AUCTION_PORT']}"
    with log.open("ab") as output:
        process = subprocess.Popen(
            [*CLI, "serve", "--log-level", "warning"], env=env, stdout=output, stderr=output
        )
    try:
        try:
            wait_until_healthy(url, process)
        except RuntimeError as error:
            raise RuntimeError(f"{error}:\n{log.read_text()}") from None
        yield url, process
    finally:
        if process.poll() is None:
            process.terminate()
        process.wait(30)


def _post(url: str, key: str, rid: str, bid: str) -> httpx.Response:
    body = {
        "text": f"{rid} prompt of its own",
        "bid": bid,
        "rid": rid,
        "sampling_params": {"max_new_tokens": 4},
    }
    with httpx.Client(base_url=url, timeout=30) as client:
        return client.post("/generate", headers={"Authorization": f"Bearer {key}"}, json=body)


def _blocked_statement(ledger: Ledger, application_name: str, lock_pid: int) -> str | None:
    """The statement of a server backend that waits on `lock_pid` inside a transaction that
    has already written (it has a transaction id), if there is one.

    Asked on a connection of its own: within a transaction, pg_stat_activity does not change.
    """
    with ledger.engine.connect() as connection:
        row = connection.execute(
            text(
                "SELECT query FROM pg_stat_activity WHERE application_name = :app"
                " AND backend_xid IS NOT NULL AND :lock = ANY(pg_blocking_pids(pid))"
            ),
            {"app": application_name, "lock": lock_pid},
        ).first()
    return None if row is None else str(row[0])


def _written_tables(ledger: Ledger, application_name: str) -> set[str]:
    """Tables the server's open transactions have inserted into or updated."""
    with ledger.engine.connect() as connection:
        rows = connection.execute(
            text(
                "SELECT c.relname FROM pg_locks l JOIN pg_class c ON c.oid = l.relation"
                " JOIN pg_stat_activity a ON a.pid = l.pid"
                " WHERE a.application_name = :app AND l.mode = 'RowExclusiveLock'"
            ),
            {"app": application_name},
        ).all()
    return {str(row[0]) for row in rows}


def _server_backends(ledger: Ledger, application_name: str) -> int:
    with ledger.engine.connect() as connection:
        count = connection.scalar(
            text("SELECT count(*) FROM pg_stat_activity WHERE application_name = :app"),
            {"app": application_name},
        )
    return int(count or 0)


def _count(ledger: Ledger, table: str) -> int:
    with ledger.engine.connect() as connection:
        return int(connection.scalar(text(f"SELECT count(*) FROM {table}")) or 0)


def _tagged(database_url: str) -> tuple[str, str]:
    """The URL with an application name of its own, so the server's sessions can be found."""
    application_name = f"crash-{secrets.token_hex(4)}"
    url = make_url(database_url).update_query_dict({"application_name": application_name})
    return url.render_as_string(hide_password=False), application_name


def _crash_set_up(
    db: MigratedDatabase,
) -> tuple[str, str, Ledger, dict[str, str], dict[str, str]]:
    """A tagged server URL and its application name (`_tagged`), the ledger, and each user of
    `BIDS` created with `GRANT`: their API keys and their "crash" requests' ledger rids."""
    server_url, application_name = _tagged(db.url)
    ledger = Ledger(db.engine)
    keys = {user: ledger.create_user(user, budget_micros=GRANT).api_key for user in BIDS}
    rids = {user: f"{user}/crash" for user in BIDS}
    return server_url, application_name, ledger, keys, rids


@contextmanager
def _settlement_blocked(
    db: MigratedDatabase,
    application_name: str,
    url: str,
    keys: dict[str, str],
    pool: ThreadPoolExecutor,
) -> Iterator[tuple[dict[str, Future[httpx.Response]], int]]:
    """alice's and bob's "crash" holds are placed; the test locks those two hold rows, and
    carol's request closes the batch (of three), whose settlement then blocks on the locks.
    Yields the three replies and the locking session's pid; the lock goes when the block ends."""
    ledger = Ledger(db.engine)
    replies = {
        user: pool.submit(_post, url, keys[user], "crash", BIDS[user]) for user in ("alice", "bob")
    }
    _wait_until(
        lambda: all(get_hold(ledger, f"{u}/crash") is not None for u in ("alice", "bob")),
        10,
        "holds of alice and bob",
    )
    with db.engine.connect() as lock:
        transaction = lock.begin()
        locked = lock.execute(
            text("SELECT rid FROM holds WHERE rid IN (:a, :b) FOR UPDATE NOWAIT"),
            {"a": "alice/crash", "b": "bob/crash"},
        ).all()
        assert len(locked) == 2
        lock_pid = lock.scalar(text("SELECT pg_backend_pid()"))
        replies["carol"] = pool.submit(_post, url, keys["carol"], "crash", BIDS["carol"])
        _wait_until(
            lambda: _blocked_statement(ledger, application_name, lock_pid),
            15,
            "the settlement blocked after its first writes",
        )
        try:
            yield replies, lock_pid
        finally:
            transaction.rollback()


def _holds_after_the_crash(ledger: Ledger, rids: dict[str, str]) -> set[str]:
    """The users whose "crash" holds survived the crash, every one open and unclaimed.

    alice's and bob's holds were committed before the batch closed; carol's request closed
    it, so its hold may have gone into the batch's own transaction (a batch that closes at
    once places its last holds in the same commit as its claim) and died with it."""
    survived = set()
    for user in BIDS:
        hold = get_hold(ledger, rids[user])
        if hold is None:
            assert user == "carol", f"{user}'s hold, committed before the batch, is gone"
            continue
        assert str(hold.state) == "open" and hold.batch_id is None
        survived.add(user)
    return survived


@pytest.mark.postgres
def test_sigkill_in_the_middle_of_settling_settles_nothing_and_recovers(
    postgres_db: MigratedDatabase, tmp_path: Path
) -> None:
    server_url, application_name, ledger, keys, rids = _crash_set_up(postgres_db)
    log = tmp_path / "server.log"

    # 1. A batch closes at three requests, its settlement blocked on two of its holds.
    env = _environment(
        server_url,
        free_port(),
        batch_size=3,
        max_wait_ms=60_000,
        run_jobs="false",
        replica_name=RESTARTED,
    )
    with (
        _serve(env, log) as (url, process),
        ThreadPoolExecutor(3) as pool,
        _settlement_blocked(postgres_db, application_name, url, keys, pool) as (replies, lock_pid),
    ):
        # It has written the batch and its request rows, and waits to close the holds.
        blocked = _blocked_statement(ledger, application_name, lock_pid)
        assert blocked is not None and blocked.startswith("UPDATE holds"), blocked
        written = _written_tables(ledger, application_name)
        assert {"auction_batches", "auction_requests", "balances"} <= written, written

        # 2. SIGKILL while the settlement transaction is open (the lock goes with the block).
        os.kill(process.pid, signal.SIGKILL)
        assert process.wait(10) == -signal.SIGKILL
        for reply in replies.values():
            with pytest.raises(httpx.TransportError):
                reply.result(timeout=30)  # the connection dropped without an answer

    # PostgreSQL ends the dead server's sessions and rolls their transactions back.
    _wait_until(
        lambda: _server_backends(ledger, application_name) == 0, 15, "the server's sessions gone"
    )

    # 3. All or nothing: no batch, no request row, no charge; every hold committed before the
    # batch is still open.
    assert _count(ledger, "auction_batches") == 0
    assert _count(ledger, "auction_requests") == 0
    held = _holds_after_the_crash(ledger, rids)
    for user, bid in BIDS.items():
        kinds = ["grant", "hold"] if user in held else ["grant"]
        assert [e.kind for e in ledger.entries(user).entries] == kinds
        balance = ledger.balance(user)
        assert (balance.balance_micros, balance.held_micros) == (
            GRANT,
            round(float(bid) * 1_000_000) if user in held else 0,
        )
    assert ledger.reconcile().ok

    # 4. Restart on the same ledger: the hold-expiry job releases the stale holds.
    env = _environment(
        server_url,
        free_port(),
        replica_name=RESTARTED,
        batch_size=8,
        max_wait_ms=20,
        run_jobs="true",
        hold_max_age_seconds=2,
        hold_expiry_interval_seconds=0.5,
    )
    with _serve(env, log) as (url, process):
        _wait_until(
            lambda: all(ledger.balance(u).held_micros == 0 for u in BIDS),
            15,
            "the stale holds released",
        )
        for user in held:
            hold = get_hold(ledger, rids[user])
            assert hold is not None and str(hold.state) == "released"
            release = ledger.entries(user).entries[-1]
            assert release.kind == "release" and (release.reason or "").startswith("expired")
            assert ledger.balance(user).balance_micros == GRANT
        assert ledger.reconcile().ok
        checked = subprocess.run(
            [*CLI, "ledger", "reconcile", "--database-url", postgres_db.url],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert checked.returncode == 0, checked.stderr
        assert "agree with their entries" in checked.stdout

        # Nothing was served or charged: the client's retry with the same rid and payload is
        # admitted afresh on its re-opened hold, and served once; another payload is a 409.
        retried = _post(url, keys["alice"], "crash", BIDS["alice"])
        assert retried.status_code == 200, retried.text
        charge = retried.json()["meta_info"]["auction"]["user_batch_charge_micros"]
        assert ledger.balance("alice").balance_micros == GRANT - charge
        assert ledger.balance("alice").held_micros == 0
        hold = get_hold(ledger, rids["alice"])
        assert hold is not None and str(hold.state) == "settled"
        other = _post(url, keys["alice"], "crash", "0.3")
        assert other.status_code == 409, other.text
        assert "alice/crash" not in other.text  # the client's rid, never the ledger's id
        served = _post(url, keys["alice"], "after-restart", BIDS["alice"])
        assert served.status_code == 200, served.text
        charge += served.json()["meta_info"]["auction"]["user_batch_charge_micros"]
        assert ledger.balance("alice").balance_micros == GRANT - charge
        assert ledger.balance("alice").held_micros == 0
        assert ledger.reconcile().ok
        # A graceful stop this time: uvicorn drains, then exits by the signal it got.
        process.send_signal(signal.SIGTERM)
        assert process.wait(30) in (0, -signal.SIGTERM)
    assert "Traceback" not in log.read_text()


def _metric(url: str, name: str) -> float:
    """One sample of the server's /metrics."""
    for line in httpx.get(url + "/metrics", timeout=10).text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} not in /metrics")


@pytest.mark.postgres
def test_sigkill_while_a_batch_sent_ahead_waits_for_its_commit_answers_and_charges_nothing(
    postgres_db: MigratedDatabase, tmp_path: Path
) -> None:
    server_url, application_name, ledger, keys, rids = _crash_set_up(postgres_db)
    env = _environment(server_url, free_port(), batch_size=3, max_wait_ms=60_000, run_jobs="false")
    with _serve(env, tmp_path / "server.log") as (url, process), ThreadPoolExecutor(3) as pool:
        # 1. One batch served, so that a commit has told the server what each user can afford.
        warm = [pool.submit(_post, url, keys[user], "warm", BIDS[user]) for user in BIDS]
        assert [reply.result(timeout=30).status_code for reply in warm] == [200] * 3
        before = {user: ledger.balance(user) for user in BIDS}
        assert _metric(url, "inference_auction_batches_dispatched_ahead_total") == 0

        # 2. The next batch goes to the engine while its settlement blocks on the locks.
        with _settlement_blocked(postgres_db, application_name, url, keys, pool) as (replies, _):
            assert _metric(url, "inference_auction_batches_dispatched_ahead_total") == 1
            time.sleep(0.5)  # the engine (500x faster than real time) has long finished them

            # 3. SIGKILL while the settlement transaction is open (the lock goes with the block).
            os.kill(process.pid, signal.SIGKILL)
            assert process.wait(10) == -signal.SIGKILL
        for reply in replies.values():
            with pytest.raises(httpx.TransportError):
                reply.result(timeout=30)  # the engine had answered; the client got nothing

    # 4. Nothing of the batch was settled or charged; every hold placed before it is open.
    _wait_until(
        lambda: _server_backends(ledger, application_name) == 0, 15, "the server's sessions gone"
    )
    held = _holds_after_the_crash(ledger, rids)
    for user, bid in BIDS.items():
        assert ledger.find_request(rids[user]) is None
        after = ledger.balance(user)
        assert after.balance_micros == before[user].balance_micros
        assert after.held_micros == (round(float(bid) * 1_000_000) if user in held else 0)
    assert ledger.reconcile().ok


@pytest.mark.postgres
def test_sigkill_while_requests_are_at_the_engine_keeps_charges_until_the_procedure(
    postgres_db: MigratedDatabase, tmp_path: Path
) -> None:
    ledger = Ledger(postgres_db.engine)
    keys = {user: ledger.create_user(user, budget_micros=GRANT).api_key for user in ("ann", "ben")}
    faulty = FaultySGLang("hang")
    with faulty.serve() as engine_url:
        env = _environment(
            postgres_db.url, free_port(), batch_size=2, max_wait_ms=60_000, run_jobs="false"
        )
        env["INFERENCE_AUCTION_ENGINE_URL"] = engine_url
        with _serve(env, tmp_path / "server.log") as (url, process), ThreadPoolExecutor(2) as pool:
            replies = [
                pool.submit(_post, url, keys[u], "lost", b)
                for u, b in (("ann", "0.4"), ("ben", "0.1"))
            ]
            _wait_until(lambda: len(faulty.received) == 2, 15, "both requests at the engine")
            os.kill(process.pid, signal.SIGKILL)
            assert process.wait(10) == -signal.SIGKILL
            for reply in replies:
                with pytest.raises(httpx.TransportError):
                    reply.result(timeout=30)

    # The batch settled before dispatch: charged, holds closed, requests still `scheduled`.
    charged = {u: GRANT - ledger.balance(u).balance_micros for u in keys}
    assert sum(charged.values()) > 0
    for user in keys:
        request = ledger.find_request(f"{user}/lost")
        assert request is not None and str(request.status) == "scheduled"
        assert ledger.balance(user).held_micros == 0
        assert "refund" not in [e.kind for e in ledger.entries(user).entries]
    assert ledger.reconcile().ok  # consistent, though the users paid for nothing

    # The recovery command refunds them, once.
    recover = [
        *CLI,
        "ledger",
        "refund-unserved",
        "--older-than",
        "0",
        "--database-url",
        postgres_db.url,
    ]
    first = subprocess.run(recover, check=True, capture_output=True, text=True, timeout=60)
    assert first.stdout.strip().endswith(f"{sum(1 for c in charged.values() if c)} refunds.")
    assert ledger.refund_unserved(timedelta(0)) == []
    for user in keys:
        assert ledger.balance(user).balance_micros == GRANT
        request = ledger.find_request(f"{user}/lost")
        assert request is not None and str(request.status) == "failed"
    assert ledger.reconcile().ok


def _generate(url: str, key: str, rid: str, text_: str, bid: str) -> httpx.Response:
    body = {"text": text_, "bid": bid, "rid": rid, "sampling_params": {"max_new_tokens": 4}}
    with httpx.Client(base_url=url, timeout=30) as client:
        return client.post("/generate", headers={"Authorization": f"Bearer {key}"}, json=body)


@pytest.mark.parametrize("scheduling", ["rolling", "batches"])
def test_sigkill_after_part_of_a_batch_was_answered_refunds_only_the_rest(
    ledger_db: MigratedDatabase, tmp_path: Path, scheduling: str
) -> None:
    # ann's two requests share a prefix; her "slow" one hangs at the engine, and so does
    # carol's only one. ann's "fast" one and ben's are answered, then the server is killed.
    ledger = Ledger(ledger_db.engine)
    users = ("ann", "ben", "carol")
    keys = {user: ledger.create_user(user, budget_micros=GRANT).api_key for user in users}
    sent = {
        "ann/fast": (keys["ann"], "fast", "ann asks about rivers and lakes", "0.45"),
        "ann/slow": (keys["ann"], "slow", "ann asks about rivers and seas", "0.3"),
        "ben/b": (keys["ben"], "b", "ben asks about mountains", "0.2"),
        "carol/c": (keys["carol"], "c", "carol asks about the weather", "0.5"),
    }
    faulty = FaultySGLang()
    faulty.modes["ann/slow"] = faulty.modes["carol/c"] = "hang"
    log = tmp_path / "server.log"
    with faulty.serve() as engine_url:
        env = _environment(
            ledger_db.url,
            free_port(),
            batch_size=4,
            max_wait_ms=60_000,
            run_jobs="false",
            replica_name=RESTARTED,
            scheduling=scheduling,
        )
        env["INFERENCE_AUCTION_ENGINE_URL"] = engine_url
        with _serve(env, log) as (url, process), ThreadPoolExecutor(4) as pool:
            replies = {rid: pool.submit(_generate, url, *args) for rid, args in sent.items()}
            for rid in ("ann/fast", "ben/b"):
                reply = replies[rid].result(timeout=30)
                assert reply.status_code == 200, reply.text
                # Recorded served before the answer was sent.
                request = ledger.find_request(rid)
                assert request is not None and str(request.status) == "served"
            charge = reply.json()["meta_info"]["auction"]
            os.kill(process.pid, signal.SIGKILL)
            assert process.wait(10) == -signal.SIGKILL
            for rid in ("ann/slow", "carol/c"):
                with pytest.raises(httpx.TransportError):
                    replies[rid].result(timeout=30)
                lost = ledger.find_request(rid)
                assert lost is not None and str(lost.status) == "scheduled"
    charged = {u: GRANT - ledger.balance(u).balance_micros for u in keys}

    # Restart, and run the documented recovery while it serves.
    env = _environment(
        ledger_db.url,
        free_port(),
        batch_size=1,
        max_wait_ms=20,
        run_jobs="false",
        replica_name=RESTARTED,
        scheduling=scheduling,
    )
    with _serve(env, log) as (url, _):
        recover = [*CLI, "ledger", "refund-unserved", "--older-than", "0"]
        recover += ["--database-url", ledger_db.url]
        subprocess.run(recover, check=True, capture_output=True, text=True, timeout=60)
        fresh = _generate(url, keys["ben"], "after", "ben asks again", "0.1")
        assert fresh.status_code == 200, fresh.text
        charged["ben"] += fresh.json()["meta_info"]["auction"]["user_batch_charge_micros"]

    # The answered requests keep their charge and stay served; ann gets back exactly what
    # her unanswered request's bid added to her charge (SPEC section 1), carol, whose only
    # request went unanswered, her whole charge.
    # The auction's input order breaks ties of average bids: price in the stored arrival order.
    with ledger_db.engine.connect() as connection:
        rows = connection.execute(text("SELECT rid, arrival, position FROM auction_requests")).all()
    arrival: dict[str, int] = {str(row[0]): int(row[1]) for row in rows}
    position: dict[str, int] = {str(row[0]): int(row[2]) for row in rows}
    batch = [
        AuctionRequest(rid, rid.split("/")[0], token_ids(text_), int(float(bid) * 1_000_000))
        for rid, (_, _, text_, bid) in sorted(sent.items(), key=lambda item: arrival[item[0]])
    ]
    # ... and under the pricing rule the batch was cleared with, as the ledger recorded it.
    with ledger_db.engine.connect() as connection:
        slots = connection.execute(
            text("SELECT priority_slots FROM auction_batches WHERE n = 4")
        ).scalar_one()
    assert slots == PRIORITY_SLOTS  # fixed slots, as every server here was started
    if scheduling == "batches":
        owed = Repricer(batch, PricingRule(slots=slots)).failure_refund(
            "ann", {"ann/slow"}, charged["ann"]
        )
    else:  # a rolling head: the unanswered request's share of ann's charge (SPEC section 7)
        bids = {r.rid: r.bid for r in batch if r.user == "ann"}
        owed = rolling_share_refund(bids, position, {"ann/slow"}, charged["ann"])
        assert 0 < owed < charged["ann"]
    refunds = [e for e in ledger.entries("ann").entries if e.kind == "refund"]
    assert [e.amount_micros for e in refunds] == ([owed] if owed else [])
    assert ledger.balance("ann").balance_micros == GRANT - charged["ann"] + owed
    assert ledger.balance("ben").balance_micros == GRANT - charged["ben"]
    assert charged["carol"] > 0 and ledger.balance("carol").balance_micros == GRANT
    for rid in ("ann/slow", "carol/c"):
        assert str(ledger.find_request(rid).status) == "failed"  # type: ignore[union-attr]
    for rid in ("ann/fast", "ben/b"):
        assert str(ledger.find_request(rid).status) == "served"  # type: ignore[union-attr]
    assert charge["batch_size"] == 4
    assert ledger.reconcile().ok
