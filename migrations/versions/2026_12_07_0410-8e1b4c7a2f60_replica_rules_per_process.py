"""Replica rules per process: one row per running server process, keyed by a random id it draws
at start rather than by the replica's name (which several hosts may share, `0.0.0.0:8000`),
with where it runs and when it started; the tiers sold as text, which a long menu fits.

The table holds only the heartbeats of running servers: it is made anew, empty, and every
server started after the upgrade writes its row again. Stop the servers before upgrading.

Revision ID: 8e1b4c7a2f60
Revises: 8e1b6c4d2f90
Create Date: 2026-12-07 04:10:00.000000+00:00
"""

# ruff: noqa: N999  # dated file names sort revisions; Alembic loads them by path, not import

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "8e1b4c7a2f60"
down_revision: str | None = "8e1b6c4d2f90"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _rule_columns(tiers: sa.types.TypeEngine[str]) -> list[sa.Column[object]]:
    return [
        sa.Column("pricing_rule", sa.String(length=16), nullable=False),
        sa.Column("priority_slots", sa.Integer(), nullable=True),
        sa.Column("request_fee_micros", sa.BigInteger(), nullable=False),
        sa.Column("tiers", tiers, nullable=True),
        sa.Column("seen_at", sa.DateTime(timezone=True), nullable=False),
    ]


def _fee_check() -> sa.CheckConstraint:
    return sa.CheckConstraint(
        "request_fee_micros >= 0", name=op.f("replica_rules_request_fee_non_negative_check")
    )


def upgrade() -> None:
    op.drop_table("replica_rules")
    op.create_table(
        "replica_rules",
        sa.Column("process", sa.String(length=32), nullable=False),
        sa.Column("replica", sa.String(length=128), nullable=False),
        sa.Column("host", sa.String(length=255), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        *_rule_columns(sa.Text()),
        _fee_check(),
        sa.PrimaryKeyConstraint("process", name=op.f("replica_rules_pkey")),
    )


def downgrade() -> None:
    op.drop_table("replica_rules")
    op.create_table(
        "replica_rules",
        sa.Column("replica", sa.String(length=128), nullable=False),
        *_rule_columns(sa.String(length=500)),
        _fee_check(),
        sa.PrimaryKeyConstraint("replica", name=op.f("replica_rules_pkey")),
    )
