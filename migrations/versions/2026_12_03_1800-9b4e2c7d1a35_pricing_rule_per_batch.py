"""The pricing rule each batch was cleared under: its name, its priority slots, its request fee.

Batches settled before the rule was recorded were cleared under the paper's rule (as many
priority slots as the batch had requests, no fee), which is what the defaults say of them.

Revision ID: 9b4e2c7d1a35
Revises: 7c1f0e9a4b21
Create Date: 2026-12-03 18:00:00.000000+00:00
"""

# ruff: noqa: N999  # dated file names sort revisions; Alembic loads them by path, not import

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "9b4e2c7d1a35"
down_revision: str | None = "7c1f0e9a4b21"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("auction_batches") as batches:
        batches.add_column(
            sa.Column(
                "pricing_rule",
                sa.String(length=16),
                server_default=sa.text("'batch-size'"),
                nullable=False,
            )
        )
        batches.add_column(sa.Column("priority_slots", sa.Integer(), nullable=True))
        batches.add_column(
            sa.Column(
                "request_fee_micros", sa.BigInteger(), server_default=sa.text("0"), nullable=False
            )
        )
        batches.create_check_constraint(
            "pricing_rule_valid",
            "(pricing_rule = 'batch-size' AND priority_slots IS NULL)"
            " OR (pricing_rule = 'fixed-slots' AND priority_slots >= n)",
        )
        batches.create_check_constraint("request_fee_non_negative", "request_fee_micros >= 0")


def downgrade() -> None:
    with op.batch_alter_table("auction_batches") as batches:
        batches.drop_constraint("request_fee_non_negative", type_="check")
        batches.drop_constraint("pricing_rule_valid", type_="check")
        batches.drop_column("request_fee_micros")
        batches.drop_column("priority_slots")
        batches.drop_column("pricing_rule")
