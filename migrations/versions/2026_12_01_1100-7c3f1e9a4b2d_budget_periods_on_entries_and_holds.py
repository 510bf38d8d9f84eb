"""Budget periods on entries and holds, and budget changes that wait for the next boundary.

`ledger_entries.period_start` and `holds.period_start` record the budget period the money
belongs to. Entries written before this revision keep NULL (the ledger then counts them by their
time); open holds are given the period the ledger had open for their user, so that what they
leave unused expires with it. The `pending_*` columns of `budgets` hold a budget change until
`pending_from`.

Revision ID: 7c3f1e9a4b2d
Revises: 2e7d5a86b9a5
Create Date: 2026-12-01 11:00:00.000000+00:00
"""

# ruff: noqa: N999  # dated file names sort revisions; Alembic loads them by path, not import

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "7c3f1e9a4b2d"
down_revision: str | None = "2e7d5a86b9a5"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TIMESTAMP = sa.DateTime(timezone=True)
PENDING_COMPLETE = (
    "(pending_from IS NULL AND pending_amount_micros IS NULL AND pending_period IS NULL"
    " AND pending_timezone IS NULL) OR (pending_from IS NOT NULL"
    " AND pending_amount_micros >= 0 AND pending_period IN ('none', 'day', 'week', 'month')"
    " AND pending_timezone IS NOT NULL)"
)


def upgrade() -> None:
    # Plain ADD COLUMN, never a batch copy: a copy of ledger_entries would lose its
    # append-only triggers.
    op.add_column("ledger_entries", sa.Column("period_start", TIMESTAMP, nullable=True))
    op.create_index(
        op.f("ix_ledger_entries_user_id_ledger_entries_period_start"),
        "ledger_entries",
        ["user_id", "period_start"],
    )
    op.add_column("holds", sa.Column("period_start", TIMESTAMP, nullable=True))
    op.execute(
        "UPDATE holds SET period_start = (SELECT budgets.current_period_start FROM budgets"
        " WHERE budgets.user_id = holds.user_id) WHERE state = 'open'"
    )
    with op.batch_alter_table("budgets") as batch:
        batch.add_column(sa.Column("pending_amount_micros", sa.BigInteger(), nullable=True))
        batch.add_column(sa.Column("pending_period", sa.String(length=16), nullable=True))
        batch.add_column(sa.Column("pending_timezone", sa.String(length=64), nullable=True))
        batch.add_column(sa.Column("pending_from", TIMESTAMP, nullable=True))
        batch.create_check_constraint(op.f("budgets_pending_complete_check"), PENDING_COMPLETE)


def downgrade() -> None:
    with op.batch_alter_table("budgets") as batch:
        batch.drop_constraint(op.f("budgets_pending_complete_check"), type_="check")
        batch.drop_column("pending_from")
        batch.drop_column("pending_timezone")
        batch.drop_column("pending_period")
        batch.drop_column("pending_amount_micros")
    op.drop_column("holds", "period_start")
    op.drop_index(
        op.f("ix_ledger_entries_user_id_ledger_entries_period_start"), table_name="ledger_entries"
    )
    op.drop_column("ledger_entries", "period_start")
