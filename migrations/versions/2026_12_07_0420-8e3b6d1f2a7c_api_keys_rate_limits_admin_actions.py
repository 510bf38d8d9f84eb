"""Several named API keys per user with an expiry (`api_keys`), per-user rate limits, and the
record of administrative actions (`admin_actions`).

Each user's single key moves to `api_keys` under the name `default`, so every key issued before
keeps working.

Revision ID: 8e3b6d1f2a7c
Revises: 8e1b4c7a2f60
Create Date: 2026-12-07 04:20:00.000000+00:00
"""

# ruff: noqa: N999  # dated file names sort revisions; Alembic loads them by path, not import

from __future__ import annotations

import secrets
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "8e3b6d1f2a7c"
down_revision: str | None = "8e1b4c7a2f60"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TIMESTAMP = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "api_keys",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("user_id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("key_prefix", sa.String(length=16), nullable=False),
        sa.Column("key_hash", sa.String(length=64), nullable=False),
        sa.Column("created_at", TIMESTAMP, nullable=False),
        sa.Column("expires_at", TIMESTAMP, nullable=True),
        sa.Column("revoked_at", TIMESTAMP, nullable=True),
        sa.ForeignKeyConstraint(
            ["user_id"], ["users.id"], name=op.f("api_keys_user_id_fkey"), ondelete="restrict"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("api_keys_pkey")),
        sa.UniqueConstraint("key_prefix", name=op.f("api_keys_key_prefix_key")),
    )
    op.create_index(op.f("ix_api_keys_user_id"), "api_keys", ["user_id"])
    op.execute(
        "INSERT INTO api_keys (user_id, name, key_prefix, key_hash, created_at)"
        " SELECT id, 'default', api_key_prefix, api_key_hash, created_at FROM users"
    )
    op.create_table(
        "admin_actions",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            nullable=False,
        ),
        sa.Column("at", TIMESTAMP, nullable=False),
        sa.Column("actor", sa.String(length=128), nullable=False),
        sa.Column("action", sa.String(length=32), nullable=False),
        sa.Column("user_name", sa.String(length=64), nullable=True),
        sa.Column("details", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("admin_actions_pkey")),
    )
    op.create_index(
        op.f("ix_admin_actions_user_name_admin_actions_id"), "admin_actions", ["user_name", "id"]
    )
    with op.batch_alter_table("users") as users:
        users.drop_constraint(op.f("users_api_key_prefix_key"), type_="unique")
        users.drop_column("api_key_prefix")
        users.drop_column("api_key_hash")
        users.add_column(sa.Column("requests_per_minute", sa.Integer(), nullable=True))
        users.add_column(sa.Column("tokens_per_minute", sa.BigInteger(), nullable=True))
        users.create_check_constraint(
            "rpm_positive", "requests_per_minute IS NULL OR requests_per_minute > 0"
        )
        users.create_check_constraint(
            "tpm_positive", "tokens_per_minute IS NULL OR tokens_per_minute > 0"
        )


def downgrade() -> None:
    # The older schema holds one key per user: each keeps its newest usable key; a user with
    # none gets a placeholder no key can match (a random prefix, a hash of nothing).
    bind = op.get_bind()
    with op.batch_alter_table("users") as users:
        users.drop_constraint(op.f("users_rpm_positive_check"), type_="check")
        users.drop_constraint(op.f("users_tpm_positive_check"), type_="check")
        users.drop_column("requests_per_minute")
        users.drop_column("tokens_per_minute")
        users.add_column(sa.Column("api_key_prefix", sa.String(length=16), nullable=True))
        users.add_column(sa.Column("api_key_hash", sa.String(length=64), nullable=True))
    keys = bind.execute(
        sa.text(
            "SELECT user_id, key_prefix, key_hash FROM api_keys WHERE revoked_at IS NULL"
            " ORDER BY id"
        )
    ).all()
    newest = {user_id: (prefix, digest) for user_id, prefix, digest in keys}
    for (user_id,) in bind.execute(sa.text("SELECT id FROM users")).all():
        prefix, digest = newest.get(user_id, (secrets.token_hex(6), "0" * 64))
        bind.execute(
            sa.text("UPDATE users SET api_key_prefix = :p, api_key_hash = :h WHERE id = :id"),
            {"p": prefix, "h": digest, "id": user_id},
        )
    with op.batch_alter_table("users") as users:
        users.alter_column("api_key_prefix", existing_type=sa.String(length=16), nullable=False)
        users.alter_column("api_key_hash", existing_type=sa.String(length=64), nullable=False)
        users.create_unique_constraint(op.f("users_api_key_prefix_key"), ["api_key_prefix"])
    op.drop_index(op.f("ix_admin_actions_user_name_admin_actions_id"), table_name="admin_actions")
    op.drop_table("admin_actions")
    op.drop_index(op.f("ix_api_keys_user_id"), table_name="api_keys")
    op.drop_table("api_keys")
