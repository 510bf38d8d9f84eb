"""Alembic revisions of the ledger schema, one dated file each."""
