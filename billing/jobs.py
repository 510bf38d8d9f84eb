"""Periodic ledger jobs on APScheduler: budget rollover, expiry of stale holds, reconciliation,
and on a PostgreSQL server whose autovacuum is off, the statistics of the ledger's tables.

Each job is idempotent and derives its work from the database (the first three are `Ledger`
methods), so several replicas may run the same schedule at once without granting or releasing
twice.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from apscheduler.schedulers.background import BackgroundScheduler

from inference_auctions.billing.ledger import Ledger
from inference_auctions.billing.settings import LedgerSettings
from inference_auctions.billing.table_statistics import analyze_if_autovacuum_off

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


def run_table_statistics(ledger: Ledger) -> None:
    """Analyze the ledger tables that autovacuum would have, where it is off."""
    analyze_if_autovacuum_off(ledger.engine)


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
    if ledger.engine.dialect.name == "postgresql":
        jobs.append(
            (
                run_table_statistics,
                (ledger,),
                settings.statistics_interval_seconds,
                "ledger-table-statistics",
            )
        )
    for func, args, seconds, job_id in jobs:
        scheduler.add_job(func, "interval", args=args, seconds=seconds, id=job_id, name=job_id)
    scheduler.start()
    return scheduler
