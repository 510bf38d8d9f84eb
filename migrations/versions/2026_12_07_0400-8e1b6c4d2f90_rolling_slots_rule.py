"""The rolling auction's rule: batches that are the head of a waiting pool ordered whole,
each user charged for the delay its head requests impose on the pool (`rolling-slots`).

Revision ID: 8e1b6c4d2f90
Revises: 5d2a7f3c9e41
Create Date: 2026-12-07 04:00:00.000000+00:00
"""

# ruff: noqa: N999  # dated file names sort revisions; Alembic loads them by path, not import

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "8e1b6c4d2f90"
down_revision: str | None = "5d2a7f3c9e41"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# The metadata's naming convention made "pricing_rule_valid" this name on creation.
_NAME = "auction_batches_pricing_rule_valid_check"
_FIXED_PRICES = (
    " OR (pricing_rule IN ('tiers', 'fcfs') AND priority_slots IS NULL AND request_fee_micros = 0)"
)
_BEFORE = (
    "(pricing_rule = 'batch-size' AND priority_slots IS NULL)"
    " OR (pricing_rule = 'fixed-slots' AND priority_slots >= n)" + _FIXED_PRICES
)
_WITH_ROLLING = (
    "(pricing_rule = 'batch-size' AND priority_slots IS NULL)"
    " OR (pricing_rule IN ('fixed-slots', 'rolling-slots') AND priority_slots >= n)" + _FIXED_PRICES
)


def upgrade() -> None:
    with op.batch_alter_table("auction_batches") as batches:
        batches.drop_constraint(op.f(_NAME), type_="check")
        batches.create_check_constraint("pricing_rule_valid", _WITH_ROLLING)


def downgrade() -> None:
    # The older schema knows no rolling batch: refused rather than rewritten, since their
    # refunds read a rule it does not know.
    rolling = (
        op.get_bind()
        .execute(
            sa.text("SELECT count(*) FROM auction_batches WHERE pricing_rule = 'rolling-slots'")
        )
        .scalar_one()
    )
    if rolling:
        raise RuntimeError(
            f"{rolling} batches were cleared by the rolling auction, which the older schema "
            "cannot record; downgrading would lose how they were priced"
        )
    with op.batch_alter_table("auction_batches") as batches:
        batches.drop_constraint(op.f(_NAME), type_="check")
        batches.create_check_constraint("pricing_rule_valid", _BEFORE)
