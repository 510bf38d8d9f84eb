"""The latest reconciliation of the ledger, refreshed in the background for the dashboard.

Reconciling sums every entry, so the dashboard never waits on it: a poll returns the last
report and, when that is older than `interval`, starts the next one in a thread.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from datetime import UTC, datetime

from inference_auctions.billing import Ledger, ReconcileView

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ReconcileStatus:
    """The outcome of the last reconciliation this process ran, and when it finished."""

    finished_at: datetime | None
    report: ReconcileView | None
    error: str | None
    running: bool


class ReconcileWatch:
    """Runs `ledger.reconcile()` at most once per `interval` seconds, on demand."""

    def __init__(self, interval: float = 60.0) -> None:
        self._interval = interval
        self._finished_at: datetime | None = None
        self._report: ReconcileView | None = None
        self._error: str | None = None
        self._task: asyncio.Task[None] | None = None

    def status(self, ledger: Ledger) -> ReconcileStatus:
        """The last result; starts a new reconciliation when that one is stale."""
        now = datetime.now(UTC)
        stale = (
            self._finished_at is None or (now - self._finished_at).total_seconds() >= self._interval
        )
        if stale and (self._task is None or self._task.done()):
            self._task = asyncio.get_running_loop().create_task(self._run(ledger))
        return ReconcileStatus(
            finished_at=self._finished_at,
            report=self._report,
            error=self._error,
            running=self._task is not None and not self._task.done(),
        )

    async def _run(self, ledger: Ledger) -> None:
        try:
            self._report = await asyncio.to_thread(ledger.reconcile)
            self._error = None
        except Exception as error:  # the database is down: shown on the dashboard, not raised
            log.warning("reconciliation for the dashboard failed: %s", error)
            self._error = "the ledger did not answer"
        self._finished_at = datetime.now(UTC)
