"""The request fee: its own entry kind, and the rule each running replica clears under.

`ledger_entries.kind` gains `fee` (a fee taken, < 0, or given back for a failed request, > 0).
`replica_rules` records the pricing rule of every running replica, so that a replica whose
rule differs from another live one's refuses to start.

SQLite cannot alter a CHECK constraint: `ledger_entries` is copied (batch mode, with foreign
keys off as every migration runs there), which drops its append-only triggers with the old
table; they are created again on the copy.

Revision ID: 5d2f8a1c9e47
Revises: 3b8d4c2e6f10
Create Date: 2026-12-03 22:00:00.000000+00:00
"""

# ruff: noqa: N999  # dated file names sort revisions; Alembic loads them by path, not import

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "5d2f8a1c9e47"
down_revision: str | None = "3b8d4c2e6f10"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_KINDS = "'grant', 'hold', 'release', 'charge', 'refund', 'adjustment'"
_SIGNS = (
    "(kind = 'grant' AND amount_micros > 0)"
    " OR (kind = 'hold' AND amount_micros >= 0)"
    " OR (kind = 'release' AND amount_micros <= 0)"
    " OR (kind = 'charge' AND amount_micros < 0)"
    " OR (kind = 'refund' AND amount_micros > 0)"
    " OR (kind = 'adjustment' AND amount_micros <> 0)"
)
_FEE_SIGN = " OR (kind = 'fee' AND amount_micros <> 0)"
_APPEND_ONLY_MESSAGE = "ledger_entries is append-only: correct a mistake with a new entry"


def upgrade() -> None:
    _entry_constraints(f"kind IN ({_KINDS}, 'fee')", _SIGNS + _FEE_SIGN)
    op.create_table(
        "replica_rules",
        sa.Column("replica", sa.String(length=128), nullable=False),
        sa.Column("pricing_rule", sa.String(length=16), nullable=False),
        sa.Column("priority_slots", sa.Integer(), nullable=True),
        sa.Column("request_fee_micros", sa.BigInteger(), nullable=False),
        sa.Column("seen_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint(
            "request_fee_micros >= 0", name=op.f("replica_rules_request_fee_non_negative_check")
        ),
        sa.PrimaryKeyConstraint("replica", name=op.f("replica_rules_pkey")),
    )


def downgrade() -> None:
    fees = op.get_bind().scalar(sa.text("SELECT count(*) FROM ledger_entries WHERE kind = 'fee'"))
    if fees:
        # Entries are append-only: history with fees has no form in the older schema.
        raise RuntimeError(
            f"the ledger holds {fees} fee entries, which the older schema cannot record"
        )
    op.drop_table("replica_rules")
    _entry_constraints(f"kind IN ({_KINDS})", _SIGNS)


def _entry_constraints(kinds: str, signs: str) -> None:
    sqlite = op.get_bind().dialect.name == "sqlite"
    if sqlite:
        for action in ("update", "delete"):
            op.execute(f"DROP TRIGGER IF EXISTS ledger_entries_no_{action}")
    with op.batch_alter_table("ledger_entries") as entries:
        entries.drop_constraint(op.f("ledger_entries_kind_valid_check"), type_="check")
        entries.drop_constraint(op.f("ledger_entries_amount_sign_check"), type_="check")
        entries.create_check_constraint(op.f("ledger_entries_kind_valid_check"), kinds)
        entries.create_check_constraint(op.f("ledger_entries_amount_sign_check"), signs)
    if sqlite:
        # The copy is a new table: the database itself refuses to rewrite history again.
        for action in ("update", "delete"):
            op.execute(
                f"CREATE TRIGGER ledger_entries_no_{action} BEFORE {action.upper()}"
                f" ON ledger_entries BEGIN SELECT RAISE(ABORT, '{_APPEND_ONLY_MESSAGE}'); END"
            )
