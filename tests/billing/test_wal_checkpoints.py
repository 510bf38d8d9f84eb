"""A server's SQLite ledger is checkpointed by a thread of its own, not by the connection that
commits (`billing.wal_checkpoints`): the writers leave the WAL alone up to the backstop, the
thread copies it into the database file, the WAL stays bounded, and the writer keeps its page
cache."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from sqlalchemy import Engine, text

from inference_auctions.billing import HoldInput, Ledger, upgrade_schema
from inference_auctions.billing.database import create_ledger_engine
from inference_auctions.billing.wal_checkpoints import (
    BACKSTOP_PAGES,
    CheckpointResult,
    WalCheckpointer,
    checkpoints_apply,
)
from tests.billing.helpers import read_calls
from tests.db_fixtures import require_postgres

StartedThreads = Callable[[], int]


@pytest.fixture
def started_threads() -> StartedThreads:
    """The checkpoint threads alive now, less those alive when the test began: one that another
    test left running (a server whose shutdown never ran) must not decide this one."""
    before = _checkpoint_threads()
    return lambda: _checkpoint_threads() - before


_ROW = "x" * 1_000  # about four rows to a page


def _table(engine: Engine) -> None:
    with engine.begin() as connection:
        connection.execute(text("CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT)"))


def _write_pages(engine: Engine, pages: int) -> None:
    """Commit about `pages` new pages, a few at a time, as the ledger writer does."""
    for _ in range(pages // 10):
        with engine.begin() as connection:
            connection.execute(text("INSERT INTO t (v) VALUES (:v)"), [{"v": _ROW}] * 40)


def _pages_in_file(path: Path) -> int:
    return path.stat().st_size // 4096


def test_writers_leave_the_wal_to_the_checkpointer(tmp_path: Path) -> None:
    # SQLite's default: the committing connection copies the WAL back past 1,000 pages.
    default = create_ledger_engine(f"sqlite:///{tmp_path / 'default.db'}")
    _table(default)
    _write_pages(default, 1_500)
    assert _pages_in_file(tmp_path / "default.db") > 500
    default.dispose()

    path = tmp_path / "ledger.db"
    engine = create_ledger_engine(f"sqlite:///{path}", wal_autocheckpoint=BACKSTOP_PAGES)
    _table(engine)
    _write_pages(engine, 1_500)
    assert _pages_in_file(path) < 10  # everything is still in the WAL only
    checkpointer = WalCheckpointer(engine)
    try:
        result = checkpointer.checkpoint()
    finally:
        checkpointer.close()
    assert result is not None and result.wal_pages > 1_500
    assert result.copied_pages == result.wal_pages  # nobody else was reading or writing
    assert _pages_in_file(path) > 1_000
    with engine.connect() as connection:  # and what was copied is the data
        assert connection.execute(text("SELECT count(*) FROM t")).scalar() == 150 * 40
    engine.dispose()


def test_the_thread_checkpoints_every_interval_and_stops(
    tmp_path: Path, started_threads: StartedThreads
) -> None:
    path = tmp_path / "ledger.db"
    engine = create_ledger_engine(f"sqlite:///{path}", wal_autocheckpoint=BACKSTOP_PAGES)
    _table(engine)
    checkpointer = WalCheckpointer(engine, interval=0.02).start()
    try:
        _write_pages(engine, 300)
        deadline = time.monotonic() + 10
        while _pages_in_file(path) < 250 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert _pages_in_file(path) >= 250
        assert started_threads() == 1
    finally:
        checkpointer.close()
        engine.dispose()
    assert started_threads() == 0
    assert checkpointer.checkpoint() is None  # closed for good


def test_the_wal_stays_bounded_under_constant_writes(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    backstop = 200
    engine = create_ledger_engine(f"sqlite:///{path}", wal_autocheckpoint=backstop)
    _table(engine)
    checkpointer = WalCheckpointer(engine, interval=0.05).start()
    largest = 0
    try:
        for _ in range(600):  # about 6,000 pages, thirty times the backstop
            _write_pages(engine, 10)
            largest = max(largest, Path(f"{path}-wal").stat().st_size)
    finally:
        checkpointer.close()
        engine.dispose()
    # A WAL page is a 4 KiB page and a 24-byte header. A commit that crosses the backstop
    # skips its checkpoint while the thread is copying, and the next one tries again, so the
    # WAL passes the backstop by what is committed during the thread's checkpoints: up to about
    # twice the backstop with both cores busy elsewhere. A WAL that never started over would
    # hold all 6,000 pages.
    assert largest <= 5 * backstop * (4096 + 24), largest
    assert _pages_in_file(path) > 4_000


def test_two_servers_checkpoint_one_file_without_errors(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    engine = create_ledger_engine(f"sqlite:///{path}", wal_autocheckpoint=BACKSTOP_PAGES)
    _table(engine)
    checkpointers = [WalCheckpointer(engine), WalCheckpointer(engine)]
    results: list[CheckpointResult | None] = []
    stop = threading.Event()

    def keep_checkpointing(checkpointer: WalCheckpointer) -> None:
        while not stop.is_set():
            results.append(checkpointer.checkpoint())

    threads = [threading.Thread(target=keep_checkpointing, args=(c,)) for c in checkpointers]
    for thread in threads:
        thread.start()
    try:
        _write_pages(engine, 500)
    finally:
        stop.set()
        for thread in threads:
            thread.join()
        for checkpointer in checkpointers:
            checkpointer.close()
    final = WalCheckpointer(engine)
    last = final.checkpoint()
    final.close()
    engine.dispose()
    assert any(result is not None and result.copied_pages > 0 for result in results)
    assert last is not None and last.copied_pages == last.wal_pages


@pytest.mark.skipif(not Path("/proc/self/io").exists(), reason="counts reads in /proc/self/io")
def test_the_writer_keeps_its_page_cache_across_checkpoints(tmp_path: Path) -> None:
    alone = _reads_per_hold(tmp_path / "alone.db", checkpoint_between=False)
    checkpointed = _reads_per_hold(tmp_path / "checkpointed.db", checkpoint_between=True)
    # A connection whose cache a checkpoint had emptied would read back every page it touches
    # (tests/billing/test_connection_reuse.py: several reads a write more).
    assert checkpointed <= alone + 0.25, (checkpointed, alone)


def _reads_per_hold(path: Path, *, checkpoint_between: bool) -> float:
    """Reads from files per hold placed, not counting the checkpoints' own."""
    url = f"sqlite:///{path}"
    upgrade_schema(url)
    engine = create_ledger_engine(url, wal_autocheckpoint=BACKSTOP_PAGES)
    checkpointer = WalCheckpointer(engine)
    ledger = Ledger(engine)
    ledger.create_user("ada", budget_micros=10**9)
    reads = 0
    try:
        _hold(ledger, "warm")
        for index in range(40):
            before = read_calls()
            _hold(ledger, f"timed-{index}")
            reads += read_calls() - before
            if checkpoint_between:
                copied = checkpointer.checkpoint()
                assert copied is not None and copied.copied_pages == copied.wal_pages > 0
    finally:
        checkpointer.close()
        engine.dispose()
    return reads / 40


def test_ledger_from_url_checkpoints_a_sqlite_file_in_the_background(
    tmp_path: Path, started_threads: StartedThreads
) -> None:
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    upgrade_schema(url)
    ledger = Ledger.from_url(url, checkpoint_in_background=True)
    try:
        assert started_threads() == 1
        with ledger.engine.connect() as connection:
            pragma = connection.exec_driver_sql("PRAGMA wal_autocheckpoint").scalar()
        assert pragma == BACKSTOP_PAGES
    finally:
        ledger.close()
    assert started_threads() == 0
    # Without the option, SQLite's own checkpoints, and no thread.
    with Ledger.from_url(url) as plain, plain.engine.connect() as connection:
        assert connection.exec_driver_sql("PRAGMA wal_autocheckpoint").scalar() == 1_000
        assert started_threads() == 0


def test_nothing_to_checkpoint_in_memory(started_threads: StartedThreads) -> None:
    memory = create_ledger_engine("sqlite://")
    assert not checkpoints_apply(memory)
    with pytest.raises(ValueError, match="not a SQLite database file"):
        WalCheckpointer(memory)
    with Ledger.from_url("sqlite://", checkpoint_in_background=True):
        assert started_threads() == 0
    memory.dispose()


@pytest.mark.postgres
def test_postgres_ledgers_run_no_checkpoint_thread(started_threads: StartedThreads) -> None:
    url = require_postgres()
    with Ledger.from_url(url, checkpoint_in_background=True) as ledger:
        assert not checkpoints_apply(ledger.engine)
        assert started_threads() == 0


def _hold(ledger: Ledger, rid: str) -> None:
    [placed] = ledger.place_holds([HoldInput("ada", rid, 1_000)])
    assert not isinstance(placed, Exception), placed


def _checkpoint_threads() -> int:
    return sum(thread.name == "sqlite-checkpoints" for thread in threading.enumerate())
