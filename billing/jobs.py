"""Periodic ledger jobs on APScheduler: budget rollover, expiry of stale holds, reconciliation.

Each job is idempotent and derives its work from the database (each is a `Ledger` method), so
several replicas may run the same schedule at once without granting or releasing twice.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from apscheduler.schedulers.background import BackgroundScheduler
from sqlalchemy.exc import DBAPIError, OperationalError

from inference_auctions.billing.errors import LedgerUnavailable
from inference_auctions.billing.ledger import Ledger
from inference_auctions.billing.settings import LedgerSettings

logger = logging.getLogger(__name__)


def run_rollover(ledger: Ledger) -> None:
    """Open the current budget period of every user that is due."""
    result = ledger.rollover()
    if result.granted:
        logger.info("budget period opened for %d users", len(result.granted))


def run_hold_expiry(ledger: Ledger, max_age: timedelta) -> None:
    """Release holds older than `max_age`."""
    released = ledger.expire_holds(max_age=max_age)
    if released:
        logger.warning("released %d holds older than %s", released, max_age)


def run_reconcile(ledger: Ledger) -> None:
    """Check every balance against its entries and log each drifted account."""
    report = ledger.reconcile()
    for drift in report.drifts:
        logger.error("ledger drift: %s", drift)


def start_scheduler(ledger: Ledger, settings: LedgerSettings) -> BackgroundScheduler:
    """Start a background scheduler running the ledger jobs; call `.shutdown()` to stop it."""
    scheduler = BackgroundScheduler(
        timezone="UTC",
        # A job that falls behind runs once, not once per missed interval, and never overlaps.
        job_defaults={"coalesce": True, "max_instances": 1, "misfire_grace_time": 60},
    )
    jobs: list[tuple[Callable[..., None], tuple[Any, ...], float, str]] = [
        (run_rollover, (ledger,), settings.rollover_interval_seconds, "ledger-rollover"),
        (
            run_hold_expiry,
            (ledger, timedelta(seconds=settings.hold_max_age_seconds)),
            settings.hold_expiry_interval_seconds,
            "ledger-hold-expiry",
        ),
        (run_reconcile, (ledger,), settings.reconcile_interval_seconds, "ledger-reconcile"),
    ]
    for func, args, seconds, job_id in jobs:
        scheduler.add_job(
            _warning_when_away(func, job_id),
            "interval",
            args=args,
            seconds=seconds,
            id=job_id,
            name=job_id,
        )
    scheduler.start()
    return scheduler


def _warning_when_away(job: Callable[..., None], name: str) -> Callable[..., None]:
    """`job`, with a database that is away (or that closed the job's connection) said in one
    WARNING line instead of the scheduler's traceback: the connection is replaced and the job
    runs again at its next turn. Any other error keeps its traceback: it is a bug."""

    @functools.wraps(job)
    def run(*args: Any) -> None:
        try:
            job(*args)
        except (LedgerUnavailable, OperationalError) as error:
            # The driver's first line only: the rest may quote statements and values.
            cause = error.orig if isinstance(error, DBAPIError) else error
            lines = str(cause).strip().splitlines() or [type(cause).__name__]
            logger.warning(
                "ledger job %s did not run: %s; it runs again at its next turn", name, lines[0]
            )

    return run
