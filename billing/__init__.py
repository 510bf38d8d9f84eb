"""The SQL ledger of budgets, holds and charges: `Ledger` is the service API.

Money is integer micro-credits everywhere (`parse_credits` and `format_micros` convert). The
schema is built by the Alembic migrations (`upgrade_schema`), never by `create_all`.

This module is billing's one door: the server and the migrations import only what it exports,
never a submodule, never SQLAlchemy. A database that is down or locked is `LedgerUnavailable`.
"""

from billing.activity import AccountActivity, ClearingPoint, MarketActivity, Spender
from billing.database import create_ledger_engine, mask_database_url
from billing.errors import (
    BatchCapExceeded,
    ChargeExceedsHold,
    DuplicateUser,
    HoldNotOpen,
    IdempotencyConflict,
    InsufficientFunds,
    InvalidAmount,
    InvalidBatch,
    InvalidInput,
    LedgerError,
    LedgerUnavailable,
    RefundExceedsCharge,
    RequestNotScheduled,
    UnknownBatch,
    UnknownRequest,
    UnknownUser,
    UserDisabled,
)
from billing.jobs import start_scheduler
from billing.leadership import LedgerJobs
from billing.leadership import start_jobs as start_ledger_jobs
from billing.ledger import Ledger
from billing.market import ClearingSample, SpendView
from billing.migrate import current_revision as schema_revision
from billing.migrate import downgrade as downgrade_schema
from billing.migrate import head_revision, schema_drift
from billing.migrate import upgrade as upgrade_schema
from billing.models import Base as _Base
from billing.models import EntryKind, HoldState, RequestStatus
from billing.money import MAX_MICROS, MICROS_PER_CREDIT, format_micros, parse_credits
from billing.periods import Period
from billing.records import (
    AccountDrift,
    BalanceView,
    BatchRecord,
    CreatedUser,
    EntryPage,
    EntryView,
    HoldView,
    PricedRequest,
    ReconcileReport,
    RefundResult,
    RequestCompletion,
    RequestRecord,
    RequestView,
    RolloverResult,
    SettleResult,
    SummaryRow,
    UserInfo,
)
from billing.schemas import (
    BalanceRecord,
    DriftRecord,
    EntryRecord,
    LedgerRecord,
    ReconcileRecord,
    SummaryRecord,
)
from billing.settings import LedgerSettings

# The ledger's tables, for Alembic's autogenerate and drift checks.
metadata = _Base.metadata

__all__ = [
    "MAX_MICROS",
    "MICROS_PER_CREDIT",
    "AccountActivity",
    "AccountDrift",
    "BalanceRecord",
    "BalanceView",
    "BatchCapExceeded",
    "BatchRecord",
    "ChargeExceedsHold",
    "ClearingPoint",
    "ClearingSample",
    "CreatedUser",
    "DriftRecord",
    "DuplicateUser",
    "EntryKind",
    "EntryPage",
    "EntryRecord",
    "EntryView",
    "HoldNotOpen",
    "HoldState",
    "HoldView",
    "IdempotencyConflict",
    "InsufficientFunds",
    "InvalidAmount",
    "InvalidBatch",
    "InvalidInput",
    "Ledger",
    "LedgerError",
    "LedgerJobs",
    "LedgerRecord",
    "LedgerSettings",
    "LedgerUnavailable",
    "MarketActivity",
    "Period",
    "PricedRequest",
    "ReconcileRecord",
    "ReconcileReport",
    "RefundExceedsCharge",
    "RefundResult",
    "RequestCompletion",
    "RequestNotScheduled",
    "RequestRecord",
    "RequestStatus",
    "RequestView",
    "RolloverResult",
    "SettleResult",
    "SpendView",
    "Spender",
    "SummaryRecord",
    "SummaryRow",
    "UnknownBatch",
    "UnknownRequest",
    "UnknownUser",
    "UserDisabled",
    "UserInfo",
    "create_ledger_engine",
    "downgrade_schema",
    "format_micros",
    "head_revision",
    "mask_database_url",
    "metadata",
    "parse_credits",
    "schema_drift",
    "schema_revision",
    "start_ledger_jobs",
    "start_scheduler",
    "upgrade_schema",
]
