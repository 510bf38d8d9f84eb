"""The ledger writer in a process of its own: what crosses to it, and what happens when it dies.

A real writer process on a real SQLite file (`server.ledger_lanes.ProcessLane`): the ledger's
decisions come back as they were made (errors with their fields), a ledger method runs there
by name and nothing else does, a killed writer fails only what it had not answered and the
next request gets a new one, and the writer outlives the signals a supervisor sends to the
server's process group but not the server itself.
"""

from __future__ import annotations

import asyncio
import os
import pickle
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from inference_auctions.billing import (
    HoldRequest,
    HoldState,
    HoldView,
    InsufficientFunds,
    Ledger,
    LedgerUnavailable,
    UnknownRequest,
    errors,
)
from inference_auctions.billing import database as ledger_database
from inference_auctions.server.ledger_lanes import ProcessLane
from tests.billing.helpers import get_hold
from tests.db_fixtures import MigratedDatabase, migrated_database
from tests.server.harness import running_server

GRANT = 1_000_000


@pytest.fixture
def sqlite_file(tmp_path: Path) -> Iterator[MigratedDatabase]:
    with migrated_database("sqlite", tmp_path) as db:
        yield db


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _wait_until(condition: Callable[[], bool], timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


ERRORS = [
    errors.InvalidInput("rid", "must not be empty"),
    errors.InvalidAmount("amount_micros", "must not be negative"),
    errors.InvalidBatch("b1", "the cleared requests are not the claimed ones"),
    errors.UnknownUser("ann"),
    errors.UserDisabled("ann"),
    errors.UnknownRequest("ann/r1"),
    errors.InsufficientFunds("ann", available_micros=5, requested_micros=7),
    errors.HoldNotOpen("ann/r1", "settled"),
    errors.RequestNotScheduled("ann/r1", "served"),
    errors.LedgerUnavailable("database is locked"),
]


@pytest.mark.parametrize("error", ERRORS, ids=lambda e: type(e).__name__)
def test_a_ledger_error_crosses_to_another_process_as_it_was(error: errors.LedgerError) -> None:
    again = pickle.loads(pickle.dumps(error))
    assert type(again) is type(error)
    assert str(again) == str(error)
    assert vars(again) == vars(error)  # the fields the server answers with (available, state)


def test_a_group_commit_in_the_writer_process_decides_what_the_ledger_would(
    sqlite_file: MigratedDatabase,
) -> None:
    ledger = Ledger(sqlite_file.new_engine())
    ledger.create_user("ann", budget_micros=GRANT)

    async def run() -> tuple[list[HoldView | errors.LedgerError], int | None]:
        lane = ProcessLane(sqlite_file.url, "test-writer", checkpoints=True)
        try:
            await lane.start()
            holds = [
                HoldRequest("ann", "ann/fits", 600_000),
                HoldRequest("ann", "ann/not", 600_000),
            ]
            outcome = await lane.commit(holds, [], [])
            assert outcome.available == {"ann": GRANT - 600_000}
            return outcome.placed, lane.pid
        finally:
            await lane.close()

    (fits, refused), pid = asyncio.run(run())
    assert pid is not None and pid != os.getpid()
    assert isinstance(fits, HoldView) and fits.state is HoldState.OPEN
    assert isinstance(refused, InsufficientFunds)
    assert (refused.available_micros, refused.requested_micros) == (GRANT - 600_000, 600_000)
    assert ledger.balance("ann").held_micros == 600_000  # written there, seen here
    assert get_hold(ledger, "ann/not") is None
    assert ledger.reconcile().ok


def test_a_call_runs_a_ledger_method_there_and_nothing_else(sqlite_file: MigratedDatabase) -> None:
    ledger = Ledger(sqlite_file.new_engine())
    ledger.create_user("ann", budget_micros=GRANT)
    ledger.place_hold("ann", "ann/r1", 100_000, "f")

    async def run() -> None:
        lane = ProcessLane(sqlite_file.url, "test-writer", checkpoints=False)
        try:
            await lane.call(ledger.release, "ann/r1", "the client left")
            with pytest.raises(UnknownRequest):  # decided there, raised here as itself
                await lane.call(ledger.release, "ann/nothing", "no such hold")
            with pytest.raises(TypeError, match="ledger's methods only"):
                await lane.call(print, "not a ledger method")
        finally:
            await lane.close()

    asyncio.run(run())
    hold = get_hold(ledger, "ann/r1")
    assert hold is not None and str(hold.state) == "released"
    assert ledger.balance("ann").held_micros == 0


def test_a_killed_writer_fails_what_it_had_not_answered_and_the_next_request_gets_a_new_one(
    sqlite_file: MigratedDatabase, monkeypatch: pytest.MonkeyPatch
) -> None:
    ledger = Ledger(sqlite_file.new_engine())
    ledger.create_user("ann", budget_micros=GRANT)
    monkeypatch.setattr(ledger_database, "SQLITE_BUSY_TIMEOUT_S", 30.0)
    database = sqlite_file.url.removeprefix("sqlite:///")

    async def run() -> tuple[int, int]:
        lane = ProcessLane(sqlite_file.url, "test-writer", checkpoints=False)
        try:
            await lane.start()
            first = lane.pid
            assert first is not None
            lock = sqlite3.connect(database, isolation_level=None)
            lock.execute("BEGIN IMMEDIATE")  # the writer's commit waits for this lock
            waiting = asyncio.ensure_future(
                lane.commit([HoldRequest("ann", "ann/lost", 100_000)], [], [])
            )
            await asyncio.sleep(0.5)
            assert not waiting.done()
            os.kill(first, signal.SIGKILL)
            with pytest.raises(LedgerUnavailable) as lost:
                await asyncio.wait_for(waiting, 10)
            assert "exited" in lost.value.cause
            lock.execute("ROLLBACK")
            lock.close()
            outcome = await lane.commit([HoldRequest("ann", "ann/next", 100_000)], [], [])
            assert isinstance(outcome.placed[0], HoldView)
            second = lane.pid
            assert second is not None
            return first, second
        finally:
            await lane.close()

    first, second = asyncio.run(run())
    assert first != second
    assert get_hold(ledger, "ann/lost") is None  # killed inside its transaction: not written
    assert ledger.balance("ann").held_micros == 100_000
    assert not _alive(second)  # closed: it left, and was reaped
    assert ledger.reconcile().ok


def test_the_writer_ignores_a_supervisors_sigterm_and_leaves_when_closed(
    sqlite_file: MigratedDatabase,
) -> None:
    ledger = Ledger(sqlite_file.new_engine())
    ledger.create_user("ann", budget_micros=GRANT)

    async def run() -> int:
        lane = ProcessLane(sqlite_file.url, "test-writer", checkpoints=False)
        await lane.start()
        pid = lane.pid
        assert pid is not None
        os.kill(pid, signal.SIGTERM)  # sent to a draining server's whole process group
        os.kill(pid, signal.SIGINT)
        await asyncio.sleep(0.2)
        outcome = await lane.commit([HoldRequest("ann", "ann/after", 100_000)], [], [])
        assert isinstance(outcome.placed[0], HoldView)
        await lane.close()
        return pid

    pid = asyncio.run(run())
    assert not _alive(pid)
    assert ledger.balance("ann").held_micros == 100_000


_SERVER = """
import asyncio, sys
from inference_auctions.billing import HoldRequest
from inference_auctions.server.ledger_lanes import ProcessLane

async def main():
    lane = ProcessLane(sys.argv[1], "orphan-test", checkpoints=False)
    await lane.start()
    print(lane.pid, flush=True)
    await lane.commit([HoldRequest("ann", "ann/orphan", 100_000)], [], [])

asyncio.run(main())
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_the_writer_dies_with_a_killed_server(sqlite_file: MigratedDatabase) -> None:
    # A server killed in the middle of a commit must not leave a writer behind that goes on
    # to commit it: the transaction in progress goes with the server, as its own would.
    ledger = Ledger(sqlite_file.new_engine())
    ledger.create_user("ann", budget_micros=GRANT)
    lock = sqlite3.connect(sqlite_file.url.removeprefix("sqlite:///"), isolation_level=None)
    lock.execute("BEGIN IMMEDIATE")  # the writer's commit waits for this lock
    with subprocess.Popen(
        [sys.executable, "-c", _SERVER, sqlite_file.url], stdout=subprocess.PIPE, text=True
    ) as server:
        try:
            assert server.stdout is not None
            writer = int(server.stdout.readline())
            time.sleep(0.5)  # its commit is waiting for the lock
            assert _alive(writer)
            server.kill()
            server.wait(10)
            _wait_until(lambda: not _alive(writer) or _zombie(writer))
        finally:
            server.kill()
            lock.execute("ROLLBACK")
            lock.close()
    time.sleep(0.2)
    assert get_hold(ledger, "ann/orphan") is None
    assert ledger.balance("ann").held_micros == 0


def _zombie(pid: int) -> bool:
    """Dead but not yet reaped by init (its parent is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return False


def test_only_a_database_another_process_can_open_gets_a_writer_process(
    sqlite_file: MigratedDatabase,
) -> None:
    assert not Ledger(sqlite_file.new_engine()).in_memory
    assert not Ledger(ledger_database.create_ledger_engine("postgresql://127.0.0.1/test")).in_memory
    # A SQLite database in memory is this process's alone: its writer runs on a thread.
    assert Ledger(ledger_database.create_ledger_engine("sqlite://")).in_memory


def _writer_processes() -> set[int]:
    """This process's children that are ledger writer processes."""
    children: set[int] = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            command = (entry / "cmdline").read_bytes().split(b"\0")
            stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(stat[1]) == os.getpid() and b"inference_auctions.server.ledger_process" in command:
            children.add(int(entry.name))
    return children


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads the process table from /proc")
def test_a_server_with_a_writer_process_serves_charges_once_and_leaves_none_behind(
    ledger_db: MigratedDatabase,
) -> None:
    before = _writer_processes()
    with running_server(
        ledger_db, ledger_writer="process", batch_size=24, max_wait_ms=500
    ) as server:
        keys = {user: server.create_user(user, budget=100 * GRANT) for user in ("ann", "ben")}
        writers = _writer_processes() - before
        # One lane on SQLite; on PostgreSQL the `served` records have a second one.
        assert len(writers) == (2 if ledger_db.backend == "postgres" else 1)

        async def load() -> list[httpx.Response]:
            async with (
                server.async_client(keys["ann"]) as ann,
                server.async_client(keys["ben"]) as ben,
            ):
                body = {"sampling_params": {"max_new_tokens": 4}}
                calls = [
                    client.post(
                        "/generate", json={**body, "text": f"q{i}", "rid": f"r{i}", "bid": bid}
                    )
                    for i in range(12)
                    for client, bid in ((ann, "0.5"), (ben, "0.2"))
                ]
                return list(await asyncio.gather(*calls))

        responses = asyncio.run(load())
        assert [r.status_code for r in responses] == [200] * 24, responses[0].text
        answered = sum(r.json()["meta_info"]["auction"]["request_charge_micros"] for r in responses)
        charged = 0
        for user in keys:
            entries = server.ledger.entries(user, limit=200).entries
            charged += sum(-e.amount_micros for e in entries if e.kind == "charge")
            assert server.ledger.balance(user).held_micros == 0
        assert charged == answered > 0  # every answer's charge is in the ledger, once
        assert server.ledger.reconcile().ok
    assert _writer_processes() - before == set()  # the drained server closed its writers
