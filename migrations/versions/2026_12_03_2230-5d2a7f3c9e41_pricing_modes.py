"""The fixed-price pricing modes: batches cleared under `tiers` or `fcfs`, and the tiers each
running replica sells (replicas on one ledger must agree on them, `billing.replica_rules`).

Revision ID: 5d2a7f3c9e41
Revises: 5d2f8a1c9e47
Create Date: 2026-12-03 22:30:00.000000+00:00
"""

# ruff: noqa: N999  # dated file names sort revisions; Alembic loads them by path, not import

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "5d2a7f3c9e41"
down_revision: str | None = "5d2f8a1c9e47"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# The metadata's naming convention made "pricing_rule_valid" this name on creation.
_NAME = "auction_batches_pricing_rule_valid_check"
_AUCTION_RULES = (
    "(pricing_rule = 'batch-size' AND priority_slots IS NULL)"
    " OR (pricing_rule = 'fixed-slots' AND priority_slots >= n)"
)
_WITH_FIXED_PRICES = (
    _AUCTION_RULES + " OR (pricing_rule IN ('tiers', 'fcfs') AND priority_slots IS NULL"
    " AND request_fee_micros = 0)"
)


def upgrade() -> None:
    with op.batch_alter_table("auction_batches") as batches:
        batches.drop_constraint(op.f(_NAME), type_="check")
        batches.create_check_constraint("pricing_rule_valid", _WITH_FIXED_PRICES)
    # Not in batch mode: nothing points at replica_rules, and a column is added in place.
    op.add_column("replica_rules", sa.Column("tiers", sa.String(length=500), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("replica_rules") as rules:
        rules.drop_column("tiers")
    # The older schema knows no fixed-price batch: refused rather than rewritten, since their
    # charges were not priced by any rule it knows.
    bind = op.get_bind()
    fixed = bind.execute(
        sa.text("SELECT count(*) FROM auction_batches WHERE pricing_rule IN ('tiers', 'fcfs')")
    ).scalar_one()
    if fixed:
        raise RuntimeError(
            f"{fixed} batches were cleared under the tiers or fcfs mode, which the older "
            "schema cannot record; downgrading would lose how they were priced"
        )
    with op.batch_alter_table("auction_batches") as batches:
        batches.drop_constraint(op.f(_NAME), type_="check")
        batches.create_check_constraint("pricing_rule_valid", _AUCTION_RULES)
