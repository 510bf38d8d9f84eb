"""The ledger jobs on one elected replica, with failover: a PostgreSQL advisory lock.

Every job is safe to run on every replica at once (billing/jobs.py), but each run on each
replica reads the database; `reconcile` reads every entry. With `leader_election`, a
replica runs a job only while it holds a session-level advisory lock, taken on a connection of
its own and kept for as long as that connection lives. When the leader dies or loses its
connection, PostgreSQL frees the lock, and the next replica whose job comes due takes it: the
jobs move to a surviving replica within one job interval.

The lock is named after the database and the schema of the ledger, so deployments (or test
runs) that share a PostgreSQL server but not a ledger never elect each other. On SQLite, one
machine's replicas share one file and every replica runs the jobs, as without the election.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from apscheduler.schedulers.background import BackgroundScheduler
from sqlalchemy import Connection, Engine, text
from sqlalchemy.exc import DBAPIError

from inference_auctions.billing.jobs import start_scheduler
from inference_auctions.billing.ledger import Ledger
from inference_auctions.billing.settings import LedgerSettings

logger = logging.getLogger(__name__)

_LOCK_NAME = "current_database() || '.' || current_schema() || '.inference-auction-ledger-jobs'"


class JobLeadership:
    """Whether this replica leads the ledger jobs, asked before each run."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._connection: Connection | None = None
        self._lock = threading.Lock()

    def held(self) -> bool:
        """True while this replica holds the lock; tries to take it when it does not."""
        with self._lock:
            if self._connection is not None:
                try:
                    self._connection.execute(text("SELECT 1"))  # alive: the lock is still ours
                    return True
                except DBAPIError:
                    logger.warning("lost the ledger jobs' leadership with its connection")
                    self._drop()
            return self._take()

    def _take(self) -> bool:
        try:
            connection = self._engine.connect().execution_options(isolation_level="AUTOCOMMIT")
        except DBAPIError:
            return False  # the database is away: nobody leads until it is back
        try:
            taken = bool(
                connection.scalar(text(f"SELECT pg_try_advisory_lock(hashtext({_LOCK_NAME}))"))
            )
        except DBAPIError:
            taken = False
        if not taken:
            connection.close()
            return False
        logger.info("this replica now runs the ledger jobs")
        self._connection = connection
        return True

    def _drop(self) -> None:
        if self._connection is not None:
            try:
                self._connection.invalidate()  # never back to the pool with a lock on it
                self._connection.close()
            except DBAPIError:
                pass
            self._connection = None

    def release(self) -> None:
        """Let another replica lead (at shutdown), at once: the lock is given back before its
        connection closes (a closed connection's server session lets go of it only as it
        ends, a moment later)."""
        with self._lock:
            if self._connection is not None:
                try:
                    unlock = f"SELECT pg_advisory_unlock(hashtext({_LOCK_NAME}))"
                    self._connection.execute(text(unlock))
                except DBAPIError:
                    pass  # the connection is gone, and the lock with its session
            self._drop()


class LedgerJobs:
    """The running job scheduler, and the leadership it runs under (if any)."""

    def __init__(self, scheduler: BackgroundScheduler, leadership: JobLeadership | None) -> None:
        self.scheduler = scheduler
        self.leadership = leadership

    def shutdown(self, wait: bool = True) -> None:
        """Stop the jobs and hand the leadership on."""
        self.scheduler.shutdown(wait=wait)
        if self.leadership is not None:
            self.leadership.release()


def _gated(job: Callable[..., Any], leadership: JobLeadership) -> Callable[..., None]:
    def run(*args: Any) -> None:
        if leadership.held():
            job(*args)

    return run


def start_jobs(ledger: Ledger, settings: LedgerSettings, *, leader_election: bool) -> LedgerJobs:
    """The ledger jobs on every replica, or only on the elected one with `leader_election`."""
    scheduler = start_scheduler(ledger, settings)
    if not leader_election or ledger.engine.dialect.name != "postgresql":
        return LedgerJobs(scheduler, None)
    leadership = JobLeadership(ledger.engine)
    for job in scheduler.get_jobs():
        job.modify(func=_gated(job.func, leadership))
    return LedgerJobs(scheduler, leadership)
