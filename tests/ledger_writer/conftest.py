"""The server tests' fixtures: a real server and a migrated ledger on each ledger backend."""

from __future__ import annotations

from tests.server.conftest import ledger, ledger_db, server

__all__ = ["ledger", "ledger_db", "server"]
