"""The posted price floor: its own entry kind, and what each request paid of it.

`ledger_entries.kind` gains `floor` (the floor an entrant paid, < 0, or given back for a failed
request, > 0). `auction_requests.floor_micros` records each request's part of the floor (NULL
when none), so that a failed request gets exactly that back, from the server or after a crash.

SQLite cannot alter a CHECK constraint: `ledger_entries` is copied (batch mode), which drops
its append-only triggers with the old table; they are created again on the copy.

Revision ID: 9f2c5a7e1b38
Revises: 8e3b6d1f2a7c
Create Date: 2026-12-07 14:00:00.000000+00:00
"""

# ruff: noqa: N999  # dated file names sort revisions; Alembic loads them by path, not import

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "9f2c5a7e1b38"
down_revision: str | None = "8e3b6d1f2a7c"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_KINDS = "'grant', 'hold', 'release', 'charge', 'refund', 'adjustment', 'fee'"
_SIGNS = (
    "(kind = 'grant' AND amount_micros > 0)"
    " OR (kind = 'hold' AND amount_micros >= 0)"
    " OR (kind = 'release' AND amount_micros <= 0)"
    " OR (kind = 'charge' AND amount_micros < 0)"
    " OR (kind = 'refund' AND amount_micros > 0)"
    " OR (kind = 'adjustment' AND amount_micros <> 0)"
    " OR (kind = 'fee' AND amount_micros <> 0)"
)
_FLOOR_SIGN = " OR (kind = 'floor' AND amount_micros <> 0)"
_APPEND_ONLY_MESSAGE = "ledger_entries is append-only: correct a mistake with a new entry"


def upgrade() -> None:
    _entry_constraints(f"kind IN ({_KINDS}, 'floor')", _SIGNS + _FLOOR_SIGN)
    with op.batch_alter_table("auction_requests") as requests:
        requests.add_column(sa.Column("floor_micros", sa.BigInteger(), nullable=True))
        requests.create_check_constraint(
            op.f("auction_requests_floor_positive_check"),
            "floor_micros IS NULL OR floor_micros > 0",
        )


def downgrade() -> None:
    floors = op.get_bind().scalar(
        sa.text("SELECT count(*) FROM ledger_entries WHERE kind = 'floor'")
    )
    if floors:
        # Entries are append-only: history with floors has no form in the older schema.
        raise RuntimeError(
            f"the ledger holds {floors} floor entries, which the older schema cannot record"
        )
    with op.batch_alter_table("auction_requests") as requests:
        requests.drop_constraint(op.f("auction_requests_floor_positive_check"), type_="check")
        requests.drop_column("floor_micros")
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
