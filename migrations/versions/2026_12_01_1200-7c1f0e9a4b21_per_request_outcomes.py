"""Per-request outcomes: the payload fingerprint and attempt of a hold, each request's tree path.

Revision ID: 7c1f0e9a4b21
Revises: 7c1d2e9a4b60
Create Date: 2026-12-01 12:00:00.000000+00:00
"""

# ruff: noqa: N999  # dated file names sort revisions; Alembic loads them by path, not import

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "7c1f0e9a4b21"
down_revision: str | None = "7c1d2e9a4b60"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("holds") as holds:
        holds.add_column(sa.Column("fingerprint", sa.String(length=64), nullable=True))
        holds.add_column(
            sa.Column("attempt", sa.Integer(), server_default=sa.text("1"), nullable=False)
        )
    with op.batch_alter_table("auction_requests") as requests:
        requests.add_column(sa.Column("arrival", sa.Integer(), nullable=True))
        requests.add_column(sa.Column("tree_path", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("auction_requests") as requests:
        requests.drop_column("tree_path")
        requests.drop_column("arrival")
    with op.batch_alter_table("holds") as holds:
        holds.drop_column("attempt")
        holds.drop_column("fingerprint")
