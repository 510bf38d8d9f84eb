"""Initial ledger schema: users, budgets, balances, append-only entries, holds, batches.

Revision ID: 2e7d5a86b9a5
Revises:
Create Date: 2026-11-29 21:42:16.121777+00:00
"""

# ruff: noqa: N999  # dated file names sort revisions; Alembic loads them by path, not import

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "2e7d5a86b9a5"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TIMESTAMP = sa.DateTime(timezone=True)
ENTRY_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")

APPEND_ONLY_MESSAGE = "ledger_entries is append-only: correct a mistake with a new entry"

# A function in the migrated schema; `search_path` decides which schema that is.
POSTGRES_GUARD = f"""
CREATE FUNCTION ledger_entries_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION '{APPEND_ONLY_MESSAGE}';
END
$$
"""


def upgrade() -> None:
    op.create_table(
        "auction_batches",
        sa.Column("id", sa.String(length=128), nullable=False),
        sa.Column("closed_at", TIMESTAMP, nullable=False),
        sa.Column("n", sa.Integer(), nullable=False),
        sa.Column("revenue_micros", sa.BigInteger(), nullable=False),
        sa.Column("welfare_micros", sa.BigInteger(), nullable=False),
        sa.Column("tree_nodes", sa.Integer(), nullable=False),
        sa.Column("tree_depth", sa.Integer(), nullable=False),
        sa.Column("shared_tokens", sa.BigInteger(), nullable=False),
        sa.Column("total_tokens", sa.BigInteger(), nullable=False),
        sa.Column("fingerprint", sa.String(length=64), nullable=False),
        sa.Column("settled_at", TIMESTAMP, nullable=False),
        sa.CheckConstraint("n > 0", name=op.f("auction_batches_n_positive_check")),
        sa.CheckConstraint(
            "revenue_micros >= 0", name=op.f("auction_batches_revenue_non_negative_check")
        ),
        sa.CheckConstraint(
            "welfare_micros >= 0", name=op.f("auction_batches_welfare_non_negative_check")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("auction_batches_pkey")),
    )
    op.create_table(
        "users",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("api_key_prefix", sa.String(length=16), nullable=False),
        sa.Column("api_key_hash", sa.String(length=64), nullable=False),
        sa.Column("is_admin", sa.Boolean(), nullable=False),
        sa.Column("disabled", sa.Boolean(), nullable=False),
        sa.Column("created_at", TIMESTAMP, nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("users_pkey")),
        sa.UniqueConstraint("api_key_prefix", name=op.f("users_api_key_prefix_key")),
        sa.UniqueConstraint("name", name=op.f("users_name_key")),
    )
    op.create_table(
        "auction_requests",
        sa.Column("rid", sa.String(length=128), nullable=False),
        sa.Column("batch_id", sa.String(length=128), nullable=False),
        sa.Column("user_id", sa.Integer(), nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("priority", sa.Float(), nullable=False),
        sa.Column("bid_micros", sa.BigInteger(), nullable=False),
        sa.Column("prompt_tokens", sa.Integer(), nullable=False),
        sa.Column("cached_tokens", sa.Integer(), nullable=True),
        sa.Column("ttft_ms", sa.Float(), nullable=True),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("updated_at", TIMESTAMP, nullable=False),
        sa.CheckConstraint(
            "status IN ('scheduled', 'served', 'failed')",
            name=op.f("auction_requests_status_valid_check"),
        ),
        sa.CheckConstraint("bid_micros >= 0", name=op.f("auction_requests_bid_non_negative_check")),
        sa.CheckConstraint(
            "cached_tokens IS NULL OR cached_tokens >= 0",
            name=op.f("auction_requests_cached_non_negative_check"),
        ),
        sa.CheckConstraint(
            "position >= 0", name=op.f("auction_requests_position_non_negative_check")
        ),
        sa.CheckConstraint(
            "priority >= 0 AND priority <= 1", name=op.f("auction_requests_priority_range_check")
        ),
        sa.CheckConstraint(
            "prompt_tokens >= 0", name=op.f("auction_requests_prompt_tokens_non_negative_check")
        ),
        sa.ForeignKeyConstraint(
            ["batch_id"],
            ["auction_batches.id"],
            name=op.f("auction_requests_batch_id_fkey"),
            ondelete="restrict",
        ),
        sa.ForeignKeyConstraint(
            ["user_id"],
            ["users.id"],
            name=op.f("auction_requests_user_id_fkey"),
            ondelete="restrict",
        ),
        sa.PrimaryKeyConstraint("rid", name=op.f("auction_requests_pkey")),
        sa.UniqueConstraint(
            "batch_id", "position", name=op.f("auction_requests_batch_id_position_key")
        ),
    )
    op.create_index(op.f("ix_auction_requests_user_id"), "auction_requests", ["user_id"])
    op.create_table(
        "balances",
        sa.Column("user_id", sa.Integer(), nullable=False),
        sa.Column("balance_micros", sa.BigInteger(), nullable=False),
        sa.Column("held_micros", sa.BigInteger(), nullable=False),
        sa.Column("updated_at", TIMESTAMP, nullable=False),
        sa.CheckConstraint(
            "balance_micros >= held_micros", name=op.f("balances_available_non_negative_check")
        ),
        sa.CheckConstraint("held_micros >= 0", name=op.f("balances_held_non_negative_check")),
        sa.ForeignKeyConstraint(
            ["user_id"], ["users.id"], name=op.f("balances_user_id_fkey"), ondelete="restrict"
        ),
        sa.PrimaryKeyConstraint("user_id", name=op.f("balances_pkey")),
    )
    op.create_table(
        "budgets",
        sa.Column("user_id", sa.Integer(), nullable=False),
        sa.Column("amount_micros", sa.BigInteger(), nullable=False),
        sa.Column("period", sa.String(length=16), nullable=False),
        sa.Column("timezone", sa.String(length=64), nullable=False),
        sa.Column("batch_cap_micros", sa.BigInteger(), nullable=True),
        sa.Column("current_period_start", TIMESTAMP, nullable=False),
        sa.Column("updated_at", TIMESTAMP, nullable=False),
        sa.CheckConstraint(
            "period IN ('none', 'day', 'week', 'month')", name=op.f("budgets_period_valid_check")
        ),
        sa.CheckConstraint("amount_micros >= 0", name=op.f("budgets_amount_non_negative_check")),
        sa.CheckConstraint(
            "batch_cap_micros IS NULL OR batch_cap_micros > 0",
            name=op.f("budgets_cap_positive_check"),
        ),
        sa.ForeignKeyConstraint(
            ["user_id"], ["users.id"], name=op.f("budgets_user_id_fkey"), ondelete="restrict"
        ),
        sa.PrimaryKeyConstraint("user_id", name=op.f("budgets_pkey")),
    )
    op.create_table(
        "holds",
        sa.Column("rid", sa.String(length=128), nullable=False),
        sa.Column("user_id", sa.Integer(), nullable=False),
        sa.Column("amount_micros", sa.BigInteger(), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("batch_id", sa.String(length=128), nullable=True),
        sa.Column("created_at", TIMESTAMP, nullable=False),
        sa.Column("closed_at", TIMESTAMP, nullable=True),
        sa.CheckConstraint(
            "state IN ('open', 'released', 'settled')", name=op.f("holds_state_valid_check")
        ),
        sa.CheckConstraint("amount_micros >= 0", name=op.f("holds_amount_non_negative_check")),
        sa.ForeignKeyConstraint(
            ["batch_id"],
            ["auction_batches.id"],
            name=op.f("holds_batch_id_fkey"),
            ondelete="restrict",
        ),
        sa.ForeignKeyConstraint(
            ["user_id"], ["users.id"], name=op.f("holds_user_id_fkey"), ondelete="restrict"
        ),
        sa.PrimaryKeyConstraint("rid", name=op.f("holds_pkey")),
    )
    op.create_index(op.f("ix_holds_state_holds_created_at"), "holds", ["state", "created_at"])
    op.create_index(op.f("ix_holds_user_id_holds_state"), "holds", ["user_id", "state"])
    op.create_table(
        "ledger_entries",
        sa.Column("id", ENTRY_ID, nullable=False),
        sa.Column("user_id", sa.Integer(), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("amount_micros", sa.BigInteger(), nullable=False),
        sa.Column("batch_id", sa.String(length=128), nullable=True),
        sa.Column("request_id", sa.String(length=128), nullable=True),
        sa.Column("reason", sa.String(length=500), nullable=True),
        sa.Column("idempotency_key", sa.String(length=300), nullable=False),
        sa.Column("created_at", TIMESTAMP, nullable=False),
        sa.CheckConstraint(
            "(kind = 'grant' AND amount_micros > 0) OR (kind = 'hold' AND amount_micros >= 0) OR (kind = 'release' AND amount_micros <= 0) OR (kind = 'charge' AND amount_micros < 0) OR (kind = 'refund' AND amount_micros > 0) OR (kind = 'adjustment' AND amount_micros <> 0)",
            name=op.f("ledger_entries_amount_sign_check"),
        ),
        sa.CheckConstraint(
            "kind IN ('grant', 'hold', 'release', 'charge', 'refund', 'adjustment')",
            name=op.f("ledger_entries_kind_valid_check"),
        ),
        sa.ForeignKeyConstraint(
            ["batch_id"],
            ["auction_batches.id"],
            name=op.f("ledger_entries_batch_id_fkey"),
            ondelete="restrict",
        ),
        sa.ForeignKeyConstraint(
            ["user_id"], ["users.id"], name=op.f("ledger_entries_user_id_fkey"), ondelete="restrict"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("ledger_entries_pkey")),
        sa.UniqueConstraint("idempotency_key", name=op.f("ledger_entries_idempotency_key_key")),
    )
    op.create_index(op.f("ix_ledger_entries_batch_id"), "ledger_entries", ["batch_id"])
    op.create_index(
        op.f("ix_ledger_entries_user_id_ledger_entries_created_at"),
        "ledger_entries",
        ["user_id", "created_at"],
    )
    _create_append_only_guard()


def _create_append_only_guard() -> None:
    # The database itself refuses to rewrite history, whatever code connects to it.
    if op.get_bind().dialect.name == "postgresql":
        op.execute(POSTGRES_GUARD)
        op.execute(
            "CREATE TRIGGER ledger_entries_append_only BEFORE UPDATE OR DELETE ON ledger_entries"
            " FOR EACH ROW EXECUTE FUNCTION ledger_entries_append_only()"
        )
        return
    for action in ("update", "delete"):
        op.execute(
            f"CREATE TRIGGER ledger_entries_no_{action} BEFORE {action.upper()} ON ledger_entries"
            f" BEGIN SELECT RAISE(ABORT, '{APPEND_ONLY_MESSAGE}'); END"
        )


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP TRIGGER ledger_entries_append_only ON ledger_entries")
        op.execute("DROP FUNCTION ledger_entries_append_only()")
    else:
        op.execute("DROP TRIGGER ledger_entries_no_update")
        op.execute("DROP TRIGGER ledger_entries_no_delete")
    op.drop_index(
        op.f("ix_ledger_entries_user_id_ledger_entries_created_at"), table_name="ledger_entries"
    )
    op.drop_index(op.f("ix_ledger_entries_batch_id"), table_name="ledger_entries")
    op.drop_table("ledger_entries")
    op.drop_index(op.f("ix_holds_user_id_holds_state"), table_name="holds")
    op.drop_index(op.f("ix_holds_state_holds_created_at"), table_name="holds")
    op.drop_table("holds")
    op.drop_table("budgets")
    op.drop_table("balances")
    op.drop_index(op.f("ix_auction_requests_user_id"), table_name="auction_requests")
    op.drop_table("auction_requests")
    op.drop_table("users")
    op.drop_table("auction_batches")
