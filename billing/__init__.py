"""The SQL ledger of budgets, holds and charges: `Ledger` is the service API.

Money is integer micro-credits everywhere (`billing.money` parses and formats credits). The
schema is built by the Alembic migrations (`billing.migrate`), never by `create_all`.
"""

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
    RefundExceedsCharge,
    UnknownBatch,
    UnknownRequest,
    UnknownUser,
    UserDisabled,
)
from billing.ledger import Ledger
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
from billing.settings import LedgerSettings

__all__ = [
    "MAX_MICROS",
    "MICROS_PER_CREDIT",
    "AccountDrift",
    "BalanceView",
    "BatchCapExceeded",
    "BatchRecord",
    "ChargeExceedsHold",
    "CreatedUser",
    "DuplicateUser",
    "EntryKind",
    "EntryPage",
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
    "LedgerSettings",
    "Period",
    "ReconcileReport",
    "RefundExceedsCharge",
    "RefundResult",
    "RequestCompletion",
    "RequestRecord",
    "RequestStatus",
    "RequestView",
    "RolloverResult",
    "SettleResult",
    "SummaryRow",
    "UnknownBatch",
    "UnknownRequest",
    "UnknownUser",
    "UserDisabled",
    "UserInfo",
    "format_micros",
    "parse_credits",
]
