"""ORM models of the ledger schema; `Base.metadata` is what Alembic migrates.

Money columns are BIGINT micro-credits. `ledger_entries` is append-only (database triggers
refuse UPDATE and DELETE); `balances` and `holds` are the current state derived from it, kept
in the same transaction as the entries that move them.
"""

from __future__ import annotations

import enum
from datetime import UTC, datetime
from typing import Any, ClassVar, cast

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    DateTime,
    Dialect,
    Enum,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    TypeDecorator,
    UniqueConstraint,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from inference_auctions.billing.periods import Period

NAMING_CONVENTION = {
    "ix": "ix_%(column_0_N_label)s",
    "uq": "%(table_name)s_%(column_0_N_name)s_key",
    "ck": "%(table_name)s_%(constraint_name)s_check",
    "fk": "%(table_name)s_%(column_0_N_name)s_fkey",
    "pk": "%(table_name)s_pkey",
}

# SQLite's INTEGER PRIMARY KEY is its only auto-incrementing column type.
BigId = BigInteger().with_variant(Integer(), "sqlite")

NAME_LENGTH = 64
ID_LENGTH = 128
KEY_LENGTH = 300
REASON_LENGTH = 500
PROCESS_ID_LENGTH = 32
HOST_LENGTH = 255  # a DNS name's longest


class UTCDateTime(TypeDecorator[datetime]):
    """A timestamp stored in UTC and always returned timezone-aware.

    SQLite has no time zones, so values are stored there as naive UTC; PostgreSQL keeps
    TIMESTAMP WITH TIME ZONE. Naive input is refused rather than guessed.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime given to a UTC column")
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def _str_enum(enum_class: type[enum.StrEnum], length: int = 16) -> Enum:
    # Stored as plain strings checked by named CHECK constraints declared on the tables.
    return Enum(
        enum_class,
        native_enum=False,
        create_constraint=False,
        length=length,
        values_callable=lambda members: [m.value for m in members],
    )


class EntryKind(enum.StrEnum):
    """What a ledger entry does; its amount's sign is fixed by the kind."""

    GRANT = "grant"  # > 0, adds to balance
    HOLD = "hold"  # >= 0, adds to held
    RELEASE = "release"  # <= 0, takes from held
    CHARGE = "charge"  # < 0, takes from balance
    REFUND = "refund"  # > 0, adds to balance
    ADJUSTMENT = "adjustment"  # != 0, corrects balance either way
    # != 0: the request fee (docs/SPEC.md section 5) taken from balance (< 0), or given back
    # for a failed request (> 0). Its own kind, so that VCG charges and refunds stay what the
    # auction priced, and a fee's refund can never be mistaken for a charge's.
    FEE = "fee"
    # != 0: the posted price floor (docs/SPEC.md section 7) an entrant paid besides its charge
    # (< 0), or given back for a failed request (> 0). Its own kind for the reason of `fee`.
    FLOOR = "floor"


BALANCE_KINDS = (
    EntryKind.GRANT,
    EntryKind.CHARGE,
    EntryKind.REFUND,
    EntryKind.ADJUSTMENT,
    EntryKind.FEE,
    EntryKind.FLOOR,
)
HELD_KINDS = (EntryKind.HOLD, EntryKind.RELEASE)


class HoldState(enum.StrEnum):
    """Where a hold is in its life: open until released (dropped, expired) or settled."""

    OPEN = "open"
    RELEASED = "released"
    SETTLED = "settled"


class RequestStatus(enum.StrEnum):
    """A settled request's serving status: `served`, its whole answer delivered; `abandoned`,
    its client left after its first token was produced (charged: its priority was delivered);
    `failed`, the engine failed it or its client left before its first token (refunded)."""

    SCHEDULED = "scheduled"
    SERVED = "served"
    FAILED = "failed"
    ABANDONED = "abandoned"


def _in(column: str, values: type[enum.StrEnum]) -> str:
    return f"{column} IN ({', '.join(repr(v.value) for v in values)})"


class Base(DeclarativeBase):
    """Declarative base carrying the constraint naming convention."""

    metadata = MetaData(naming_convention=NAMING_CONVENTION)
    type_annotation_map: ClassVar[dict[Any, Any]] = {datetime: UTCDateTime()}


class User(Base):
    """An account; its API keys are rows of `api_keys`, stored only as hashes."""

    __tablename__ = "users"
    __table_args__ = (
        CheckConstraint(
            "requests_per_minute IS NULL OR requests_per_minute > 0", name="rpm_positive"
        ),
        CheckConstraint("tokens_per_minute IS NULL OR tokens_per_minute > 0", name="tpm_positive"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(NAME_LENGTH), unique=True)
    is_admin: Mapped[bool] = mapped_column(Boolean)
    disabled: Mapped[bool] = mapped_column(Boolean)
    created_at: Mapped[datetime]
    # Dashboard sessions signed in before this moment are over: set when the key is rotated
    # or the user disabled, so that enabling the user again revives none of them.
    sessions_from: Mapped[datetime | None]
    # The user's own rate limits (None: only the server-wide one applies).
    requests_per_minute: Mapped[int | None] = mapped_column(Integer)
    tokens_per_minute: Mapped[int | None] = mapped_column(BigInteger)


class ApiKey(Base):
    """One of a user's API keys: a name the user tells keys apart by, an optional expiry, and
    the moment it was revoked (kept, so an audit can say which key did what and until when)."""

    __tablename__ = "api_keys"
    __table_args__ = (Index(None, "user_id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="restrict"))
    name: Mapped[str] = mapped_column(String(NAME_LENGTH))
    key_prefix: Mapped[str] = mapped_column(String(16), unique=True)
    key_hash: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime]
    expires_at: Mapped[datetime | None]
    revoked_at: Mapped[datetime | None]


class AdminAction(Base):
    """One administrative change (a user created, enabled, a key rotated, a budget granted...),
    who made it and what it was, written in the transaction that made it."""

    __tablename__ = "admin_actions"
    __table_args__ = (Index(None, "user_name", "id"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    at: Mapped[datetime]
    # An admin user's name over HTTP, `cli:<login>` from the command line.
    actor: Mapped[str] = mapped_column(String(ID_LENGTH))
    action: Mapped[str] = mapped_column(String(32))
    user_name: Mapped[str | None] = mapped_column(String(NAME_LENGTH))
    # The action's arguments as JSON (never a key).
    details: Mapped[str] = mapped_column(Text)


class Budget(Base):
    """How much a user is granted per period, and the start of the period granted last.

    `amount_micros`, `period` and `timezone` are the schedule in force; a change waits in the
    `pending_*` columns until `pending_from`, the next boundary of that schedule.
    """

    __tablename__ = "budgets"
    __table_args__ = (
        CheckConstraint("amount_micros >= 0", name="amount_non_negative"),
        CheckConstraint("batch_cap_micros IS NULL OR batch_cap_micros > 0", name="cap_positive"),
        CheckConstraint(_in("period", Period), name="period_valid"),
        CheckConstraint(
            "(pending_from IS NULL AND pending_amount_micros IS NULL AND pending_period IS NULL"
            " AND pending_timezone IS NULL) OR (pending_from IS NOT NULL"
            f" AND pending_amount_micros >= 0 AND {_in('pending_period', Period)}"
            " AND pending_timezone IS NOT NULL)",
            name="pending_complete",
        ),
    )

    user_id: Mapped[int] = mapped_column(
        ForeignKey("users.id", ondelete="restrict"), primary_key=True
    )
    amount_micros: Mapped[int] = mapped_column(BigInteger)
    period: Mapped[Period] = mapped_column(_str_enum(Period))
    timezone: Mapped[str] = mapped_column(String(64))
    batch_cap_micros: Mapped[int | None] = mapped_column(BigInteger)
    current_period_start: Mapped[datetime]
    updated_at: Mapped[datetime]
    pending_amount_micros: Mapped[int | None] = mapped_column(BigInteger)
    pending_period: Mapped[Period | None] = mapped_column(_str_enum(Period))
    pending_timezone: Mapped[str | None] = mapped_column(String(64))
    pending_from: Mapped[datetime | None]


class Balance(Base):
    """A user's balance and the part of it held for requests; locked by every money move."""

    __tablename__ = "balances"
    __table_args__ = (
        CheckConstraint("held_micros >= 0", name="held_non_negative"),
        CheckConstraint("balance_micros >= held_micros", name="available_non_negative"),
    )

    user_id: Mapped[int] = mapped_column(
        ForeignKey("users.id", ondelete="restrict"), primary_key=True
    )
    balance_micros: Mapped[int] = mapped_column(BigInteger)
    held_micros: Mapped[int] = mapped_column(BigInteger)
    updated_at: Mapped[datetime]


class LedgerEntry(Base):
    """One append-only movement of money; corrections are new entries."""

    __tablename__ = "ledger_entries"
    __table_args__ = (
        CheckConstraint(_in("kind", EntryKind), name="kind_valid"),
        CheckConstraint(
            "(kind = 'grant' AND amount_micros > 0)"
            " OR (kind = 'hold' AND amount_micros >= 0)"
            " OR (kind = 'release' AND amount_micros <= 0)"
            " OR (kind = 'charge' AND amount_micros < 0)"
            " OR (kind = 'refund' AND amount_micros > 0)"
            " OR (kind = 'adjustment' AND amount_micros <> 0)"
            " OR (kind = 'fee' AND amount_micros <> 0)"
            " OR (kind = 'floor' AND amount_micros <> 0)",
            name="amount_sign",
        ),
        Index(None, "user_id", "created_at"),
        Index(None, "batch_id"),
        Index(None, "user_id", "period_start"),
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="restrict"))
    kind: Mapped[EntryKind] = mapped_column(_str_enum(EntryKind))
    amount_micros: Mapped[int] = mapped_column(BigInteger)
    batch_id: Mapped[str | None] = mapped_column(
        ForeignKey("auction_batches.id", ondelete="restrict")
    )
    request_id: Mapped[str | None] = mapped_column(String(ID_LENGTH))
    reason: Mapped[str | None] = mapped_column(String(REASON_LENGTH))
    idempotency_key: Mapped[str] = mapped_column(String(KEY_LENGTH), unique=True)
    created_at: Mapped[datetime]
    # The start of the budget period the money belongs to (see `billing.grants`); NULL on
    # entries written before periods were recorded.
    period_start: Mapped[datetime | None]


class Hold(Base):
    """Funds reserved for one request until it is settled in a batch or released."""

    __tablename__ = "holds"
    __table_args__ = (
        CheckConstraint("amount_micros >= 0", name="amount_non_negative"),
        CheckConstraint(_in("state", HoldState), name="state_valid"),
        Index(None, "state", "created_at"),
        Index(None, "user_id", "state"),
    )

    rid: Mapped[str] = mapped_column(String(ID_LENGTH), primary_key=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="restrict"))
    amount_micros: Mapped[int] = mapped_column(BigInteger)
    state: Mapped[HoldState] = mapped_column(_str_enum(HoldState))
    batch_id: Mapped[str | None] = mapped_column(
        ForeignKey("auction_batches.id", ondelete="restrict")
    )
    created_at: Mapped[datetime]
    closed_at: Mapped[datetime | None]
    # The budget period the hold was placed in; NULL for holds placed before it was recorded.
    period_start: Mapped[datetime | None]
    # SHA-256 of the request's payload: a retry must repeat it, even after a restart.
    fingerprint: Mapped[str | None] = mapped_column(String(64))
    # A released hold is opened again by a retry of the same payload; each opening counts.
    attempt: Mapped[int] = mapped_column(Integer, server_default=text("1"))


# The rules a batch may record: the auction's two, with their slots, and the fixed-price
# modes (`tiers`, `fcfs`), which have no slots and no fee.
PRICING_RULE_VALID = (
    "(pricing_rule = 'batch-size' AND priority_slots IS NULL)"
    " OR (pricing_rule IN ('fixed-slots', 'rolling-slots') AND priority_slots >= n)"
    " OR (pricing_rule IN ('tiers', 'fcfs') AND priority_slots IS NULL"
    " AND request_fee_micros = 0)"
)


class AuctionBatch(Base):
    """One cleared auction: its size, revenue, welfare and radix-tree shape."""

    __tablename__ = "auction_batches"
    __table_args__ = (
        CheckConstraint("n > 0", name="n_positive"),
        CheckConstraint("revenue_micros >= 0", name="revenue_non_negative"),
        CheckConstraint("welfare_micros >= 0", name="welfare_non_negative"),
        CheckConstraint(PRICING_RULE_VALID, name="pricing_rule_valid"),
        CheckConstraint("request_fee_micros >= 0", name="request_fee_non_negative"),
        Index(None, "closed_at"),  # the dashboard reads the batches of the last minutes
    )

    id: Mapped[str] = mapped_column(String(ID_LENGTH), primary_key=True)
    closed_at: Mapped[datetime]
    n: Mapped[int] = mapped_column(Integer)
    revenue_micros: Mapped[int] = mapped_column(BigInteger)
    welfare_micros: Mapped[int] = mapped_column(BigInteger)
    tree_nodes: Mapped[int] = mapped_column(Integer)
    tree_depth: Mapped[int] = mapped_column(Integer)
    shared_tokens: Mapped[int] = mapped_column(BigInteger)
    total_tokens: Mapped[int] = mapped_column(BigInteger)
    # SHA-256 of the settled contents, so a replay can be told from a conflicting one.
    fingerprint: Mapped[str] = mapped_column(String(64))
    settled_at: Mapped[datetime]
    # The pricing rule the batch was cleared under (docs/SPEC.md): `batch-size` (the paper's,
    # every batch settled before the rule was recorded), `fixed-slots` or `rolling-slots` (the
    # head of a rolling auction's pool) with its
    # `priority_slots`, or a fixed-price mode (`tiers`, `fcfs`: each request paid its
    # `bid_micros`, the price it was admitted at); and the fee each of its requests paid.
    # Refunds price the batch again under this rule, never under the server's current one.
    pricing_rule: Mapped[str] = mapped_column(String(16), server_default=text("'batch-size'"))
    priority_slots: Mapped[int | None] = mapped_column(Integer)
    request_fee_micros: Mapped[int] = mapped_column(BigInteger, server_default=text("0"))


# The name matters beyond reading: SQLAlchemy flushed these rows after the holds' updates when
# the class was named `LedgerRequest` (unrelated tables flush in an order that follows the
# mapper names), and the crash tests rely on settlement writing them before closing the holds.
class BatchRequest(Base):
    """One request of a settled batch; its serving status is updated after dispatch."""

    __tablename__ = "auction_requests"
    __table_args__ = (
        CheckConstraint("position >= 0", name="position_non_negative"),
        CheckConstraint("priority >= 0 AND priority <= 1", name="priority_range"),
        CheckConstraint("bid_micros >= 0", name="bid_non_negative"),
        CheckConstraint("floor_micros IS NULL OR floor_micros > 0", name="floor_positive"),
        CheckConstraint("prompt_tokens >= 0", name="prompt_tokens_non_negative"),
        CheckConstraint("cached_tokens IS NULL OR cached_tokens >= 0", name="cached_non_negative"),
        CheckConstraint(_in("status", RequestStatus), name="status_valid"),
        UniqueConstraint("batch_id", "position"),
        Index(None, "user_id"),
    )

    rid: Mapped[str] = mapped_column(String(ID_LENGTH), primary_key=True)
    batch_id: Mapped[str] = mapped_column(ForeignKey("auction_batches.id", ondelete="restrict"))
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="restrict"))
    position: Mapped[int] = mapped_column(Integer)
    # The fractional priority is a schedule position, not money, so a float is exact enough.
    priority: Mapped[float] = mapped_column(Float)
    bid_micros: Mapped[int] = mapped_column(BigInteger)
    prompt_tokens: Mapped[int] = mapped_column(Integer)
    cached_tokens: Mapped[int | None] = mapped_column(Integer)
    ttft_ms: Mapped[float | None] = mapped_column(Float)
    status: Mapped[RequestStatus] = mapped_column(_str_enum(RequestStatus))
    updated_at: Mapped[datetime]
    # Arrival index in the batch and node ids from the root of its radix tree: enough to price
    # the batch again (failure refunds) without its prompts. NULL for batches settled before.
    arrival: Mapped[int | None] = mapped_column(Integer)
    tree_path: Mapped[str | None] = mapped_column(Text)
    # What the request paid of the posted price floor (docs/SPEC.md section 7): what it gets
    # back if it fails. NULL when none (no floor, a request outside, or settled before).
    floor_micros: Mapped[int | None] = mapped_column(BigInteger)

    @property
    def tree_nodes(self) -> list[int] | None:
        """`tree_path` as node ids (it is stored as dotted text); None when not stored."""
        if self.tree_path is None:
            return None
        return [int(node) for node in self.tree_path.split(".") if node]


class ReplicaRule(Base):
    """The pricing rule a running server process clears its batches under, and when it last
    said so: one row per process.

    Replicas sharing a ledger must price every batch alike (docs/SPEC.md section 5): a process
    whose rule differs from that of another one seen lately refuses to start
    (`billing.replica_rules`). Rows are told apart by a random id each process draws when it
    starts, not by the replica's name, which several hosts may share (`0.0.0.0:8000`). A
    process deletes its own row when it stops; a crashed one's row goes stale.
    """

    __tablename__ = "replica_rules"
    __table_args__ = (CheckConstraint("request_fee_micros >= 0", name="request_fee_non_negative"),)

    process: Mapped[str] = mapped_column(String(PROCESS_ID_LENGTH), primary_key=True)
    replica: Mapped[str] = mapped_column(String(ID_LENGTH))
    # Where the process runs (its machine and process id there), for the refusal's message.
    host: Mapped[str] = mapped_column(String(HOST_LENGTH))
    pid: Mapped[int] = mapped_column(Integer)
    started_at: Mapped[datetime]
    pricing_rule: Mapped[str] = mapped_column(String(16))
    priority_slots: Mapped[int | None] = mapped_column(Integer)
    request_fee_micros: Mapped[int] = mapped_column(BigInteger)
    # Under `pricing tiers`, the tiers sold and the default one (`name=micros,...;default=x`):
    # Text, since a valid menu has no length bound a column of characters would respect.
    tiers: Mapped[str | None] = mapped_column(Text)
    seen_at: Mapped[datetime]


# The tables behind the models, typed as tables, for Core statements over many rows at once.
HOLDS = cast(Table, Hold.__table__)
LEDGER_ENTRIES = cast(Table, LedgerEntry.__table__)
AUCTION_REQUESTS = cast(Table, BatchRequest.__table__)
