from __future__ import annotations

import logging
from datetime import timedelta

import pytest
from sqlalchemy import text

from inference_auctions.billing import Ledger, LedgerSettings
from inference_auctions.billing.jobs import (
    run_hold_expiry,
    run_reconcile,
    run_rollover,
    start_scheduler,
)
from tests.billing.conftest import Clock
from tests.db_fixtures import MigratedDatabase


def test_the_scheduler_runs_the_three_jobs(ledger: Ledger) -> None:
    settings = LedgerSettings(rollover_interval_seconds=5, reconcile_interval_seconds=7)
    scheduler = start_scheduler(ledger, settings)
    try:
        jobs = {job.id: job for job in scheduler.get_jobs()}
        assert set(jobs) == {"ledger-rollover", "ledger-hold-expiry", "ledger-reconcile"}
        assert jobs["ledger-rollover"].trigger.interval == timedelta(seconds=5)
        assert jobs["ledger-reconcile"].trigger.interval == timedelta(seconds=7)
        assert jobs["ledger-hold-expiry"].args == (ledger, timedelta(hours=1))
    finally:
        scheduler.shutdown(wait=True)


def test_each_job_calls_its_service_function(
    timed_ledger: Ledger,
    clock: Clock,
    ledger_db: MigratedDatabase,
    caplog: pytest.LogCaptureFixture,
) -> None:
    ledger = timed_ledger
    ledger.create_user("alice", budget_micros=100, period="day")
    ledger.place_hold("alice", "r1", 10)
    clock.advance(days=1)
    caplog.set_level(logging.INFO, logger="inference_auctions.billing.jobs")
    run_rollover(ledger)
    run_hold_expiry(ledger, timedelta(minutes=5))
    # Yesterday's hold, released today, expires with yesterday's period.
    assert ledger.balance("alice").balance_micros == 100
    assert ledger.balance("alice").held_micros == 0
    with ledger_db.engine.begin() as connection:
        connection.execute(text("UPDATE balances SET balance_micros = 999"))
    run_reconcile(ledger)
    messages = [r.getMessage() for r in caplog.records]
    assert any("opened for 1 users" in m for m in messages)
    assert any("released 1 holds" in m for m in messages)
    assert any("ledger drift" in m and "alice" in m for m in messages)


def test_settings_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("INFERENCE_AUCTION_DATABASE_URL", "sqlite:///elsewhere.db")
    monkeypatch.setenv("INFERENCE_AUCTION_HOLD_MAX_AGE_SECONDS", "90")
    settings = LedgerSettings()
    assert settings.database_url == "sqlite:///elsewhere.db"
    assert settings.hold_max_age_seconds == 90
    monkeypatch.delenv("INFERENCE_AUCTION_DATABASE_URL")
    assert LedgerSettings().database_url == "sqlite:///inference-auction.db"
