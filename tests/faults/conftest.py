"""Fixtures of the fault tests: migrated ledgers on each backend, as the server tests use."""

from __future__ import annotations

from tests.db_fixtures import ledger, ledger_db

__all__ = ["ledger", "ledger_db"]
