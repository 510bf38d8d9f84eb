"""Index auction batches by closing time, for the dashboard's recent-window queries.

Revision ID: 7c1d2e9a4b60
Revises: 7c3f1e9a4b2d
Create Date: 2026-12-01 11:35:00.000000+00:00
"""

# ruff: noqa: N999  # dated file names sort revisions; Alembic loads them by path, not import

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "7c1d2e9a4b60"
down_revision: str | None = "7c3f1e9a4b2d"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Every dashboard poll reads the batches of the last minutes: without this index, a scan
    of every batch ever settled."""
    op.create_index(op.f("ix_auction_batches_closed_at"), "auction_batches", ["closed_at"])


def downgrade() -> None:
    """Drop the index."""
    op.drop_index(op.f("ix_auction_batches_closed_at"), table_name="auction_batches")
