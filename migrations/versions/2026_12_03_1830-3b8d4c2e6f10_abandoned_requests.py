"""Abandoned requests, and dashboard sessions that end with their key.

A request whose client left after its first token keeps its charge and is recorded
`abandoned`, not `served`. `users.sessions_from`: dashboard sessions signed in before it are
over (set when the key is rotated or the user disabled).

Revision ID: 3b8d4c2e6f10
Revises: 9b4e2c7d1a35
Create Date: 2026-12-03 18:00:00.000000+00:00
"""

# ruff: noqa: N999  # dated file names sort revisions; Alembic loads them by path, not import

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "3b8d4c2e6f10"
down_revision: str | None = "9b4e2c7d1a35"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# The metadata's naming convention makes "status_valid" this name on creation.
_NAME = "auction_requests_status_valid_check"


def upgrade() -> None:
    op.add_column("users", sa.Column("sessions_from", sa.DateTime(timezone=True), nullable=True))
    with op.batch_alter_table("auction_requests") as requests:
        requests.drop_constraint(op.f(_NAME), type_="check")
        requests.create_check_constraint(
            "status_valid", "status IN ('scheduled', 'served', 'failed', 'abandoned')"
        )


def downgrade() -> None:
    # Not in batch mode: SQLite would rebuild `users`, which other tables' keys point at.
    op.execute("ALTER TABLE users DROP COLUMN sessions_from")
    # An abandoned request kept its charge for an answer delivered in part: `served` is the
    # older schema's nearest word for it.
    op.execute("UPDATE auction_requests SET status = 'served' WHERE status = 'abandoned'")
    with op.batch_alter_table("auction_requests") as requests:
        requests.drop_constraint(op.f(_NAME), type_="check")
        requests.create_check_constraint(
            "status_valid", "status IN ('scheduled', 'served', 'failed')"
        )
