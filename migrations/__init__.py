"""Alembic migrations of the ledger schema."""
