"""SQLite's WAL checkpoints, off the writers' path.

In WAL mode a commit appends the pages it changed to the WAL file, and a checkpoint copies
them back into the database file so that the WAL can start over. By default the connection
whose commit takes the WAL past 1,000 pages runs that checkpoint itself, right after its
commit, and syncs both files. In the server that connection is the ledger writer's
(`server.ledger_writer.writer`): every few dozen group commits, one of them took a checkpoint's time
on top of its own, with requests waiting on it, and the serving path lost about a tenth of its
throughput to it (docs/PERFORMANCE.md).

A `WalCheckpointer` runs a passive checkpoint every `interval` seconds instead, from a thread
and a connection of its own. A passive checkpoint copies what is committed without waiting
for, or blocking, any reader or writer, and SQLite runs it without the interpreter's lock, so
it runs beside the event loop and the writer. Copying a second's worth of commits at once also
writes each page that many of them changed (the balances, the tails of the indexes) once
instead of once per checkpoint.

The connections that write then checkpoint only past `BACKSTOP_PAGES` (`create_ledger_engine`'s
`wal_autocheckpoint`). That is what keeps the WAL bounded: it can only start over when a writer
begins a transaction while everything in it has been copied, and under constant writes new
pages always arrive between a passive checkpoint and the next transaction. So the WAL grows to
the backstop, the writer's own checkpoint copies what arrived since this thread's last one,
and the WAL starts over: about 40 MB of WAL, instead of 4 MB (a little more when the thread is
copying at that moment: the writer's checkpoint then waits for nothing and runs after its next
commit), and the writer copies at most a second's worth of pages once in a few seconds,
instead of every page as it goes.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine

from inference_auctions.billing.database import in_a_file

__all__ = ["BACKSTOP_PAGES", "CheckpointResult", "WalCheckpointer", "checkpoints_apply"]

log = logging.getLogger(__name__)

# How often the thread checkpoints. At 20 connections the WAL grows by about 4,000 pages
# (16 MB) a second (a group commit of six requests writes about 37); a longer interval copied
# less often but was no better overall (docs/PERFORMANCE.md).
INTERVAL_SECONDS = 1.0
# The WAL's size in pages past which a writing connection checkpoints after all (above).
BACKSTOP_PAGES = 10_000


@dataclass(frozen=True, slots=True)
class CheckpointResult:
    """What `PRAGMA wal_checkpoint(PASSIVE)` answered: pages in the WAL, and how many of them
    are now copied into the database file (all of them unless a reader or a writer still
    needed some)."""

    wal_pages: int
    copied_pages: int


def checkpoints_apply(engine: Engine) -> bool:
    """Whether `engine` is a SQLite database in a file: the only kind with a WAL to copy."""
    return in_a_file(engine)


class WalCheckpointer:
    """Passive WAL checkpoints of one SQLite database, every `interval` seconds, on a thread
    and a connection of its own (see the module docstring)."""

    def __init__(self, engine: Engine, *, interval: float = INTERVAL_SECONDS) -> None:
        if not checkpoints_apply(engine):
            raise ValueError(f"{engine.url.render_as_string()} is not a SQLite database file")
        if interval <= 0:
            raise ValueError(f"interval must be positive, got {interval!r}")
        # The arguments SQLAlchemy would open the file with (a `file:` URI included), on a
        # connection outside the engine's pool: the pool hands the writer the connection
        # returned last, and a connection used for nothing but checkpoints must never be it.
        args, kwargs = engine.dialect.create_connect_args(engine.url)
        self._connect_args: tuple[list[Any], dict[str, Any]] = (list(args), dict(kwargs))
        self._interval = interval
        self._stopping = threading.Event()
        self._connection: sqlite3.Connection | None = None
        self._lock = threading.Lock()  # one checkpoint at a time on the connection
        self._thread = threading.Thread(target=self._run, name="sqlite-checkpoints", daemon=True)

    def start(self) -> WalCheckpointer:
        """Start checkpointing every `interval` seconds; returns self."""
        self._thread.start()
        return self

    def checkpoint(self) -> CheckpointResult | None:
        """One passive checkpoint now; None if it could not run (another connection was
        checkpointing, or the file could not be opened: logged, and tried again next time),
        or once `close()` was called."""
        with self._lock:
            if self._stopping.is_set():
                return None  # closed: never open a connection that nothing would close
            try:
                busy, wal_pages, copied_pages = (
                    self._connected().execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
                )
            except sqlite3.Error as error:
                log.warning("a WAL checkpoint of the ledger did not run: %s", error)
                return None
        # Busy: another connection was checkpointing (another server on the same file); nothing
        # is lost, the next checkpoint copies what this one would have.
        if busy:
            return None
        return CheckpointResult(wal_pages=wal_pages, copied_pages=copied_pages)

    def close(self) -> None:
        """Stop the thread (after the checkpoint it is running, if any) and close its
        connection."""
        self._stopping.set()
        if self._thread.is_alive():
            self._thread.join()
        with self._lock:
            if self._connection is not None:
                self._connection.close()
                self._connection = None

    def _connected(self) -> sqlite3.Connection:
        if self._connection is None:
            args, kwargs = self._connect_args
            # Used from this object's thread and from `checkpoint` callers, one at a time.
            self._connection = sqlite3.connect(
                *args, **{**kwargs, "check_same_thread": False, "isolation_level": None}
            )
        return self._connection

    def _run(self) -> None:
        while not self._stopping.wait(self._interval):
            self.checkpoint()
