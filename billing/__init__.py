"""The SQL ledger of budgets, holds and charges: `Ledger` is the service API.

Money is integer micro-credits everywhere (`parse_credits` and `format_micros` convert). The
schema is built by the Alembic migrations (`upgrade_schema`), never by `create_all`.

This module is billing's one door: the server and the CLI import only what it exports, never a
submodule, never SQLAlchemy, and it exports no SQLAlchemy object (what Alembic needs, the
tables' metadata and an engine, is `billing.schema`, for the migrations alone). A database
that is down or locked is `LedgerUnavailable`.

One name per shape: what callers hand the ledger is an `*Input` (`HoldInput`, `BatchInput`),
what it answers a `*View` (`HoldView`, `BalanceView`) or a result, and what the API, the CLI and
the exports show of a view its `*Record` (`BalanceRecord`, pydantic, `billing.schemas`).
"""

from inference_auctions.billing.activity import (
    AccountActivity,
    ClearingPoint,
    MarketActivity,
    Spender,
)
from inference_auctions.billing.audit import AdminActionView
from inference_auctions.billing.database import mask_database_url, sqlite_busy_timeout_seconds
from inference_auctions.billing.database_url import (
    check_database_url,
    probe_database,
    sqlite_file,
)
from inference_auctions.billing.decoy_watch import PrefixSquatter
from inference_auctions.billing.errors import (
    BatchCapExceeded,
    ChargeExceedsHold,
    DuplicateApiKey,
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
    RuleDisagreement,
    UnknownApiKey,
    UnknownBatch,
    UnknownRequest,
    UnknownUser,
    UserDisabled,
)
from inference_auctions.billing.fees import hold_micros
from inference_auctions.billing.group_commit import GroupOutcome
from inference_auctions.billing.inputs import (
    BatchInput,
    CompletionInput,
    HoldInput,
    RequestInput,
    ServedInput,
    client_rid,
    request_key,
)
from inference_auctions.billing.jobs import start_scheduler
from inference_auctions.billing.keys import ApiKeyView, IssuedKey
from inference_auctions.billing.leadership import LedgerJobs
from inference_auctions.billing.leadership import start_jobs as start_ledger_jobs
from inference_auctions.billing.ledger import Ledger
from inference_auctions.billing.market import ClearingSample, SpendView
from inference_auctions.billing.migrate import current_revision as schema_revision
from inference_auctions.billing.migrate import describe_drift, head_revision, schema_drift
from inference_auctions.billing.migrate import downgrade as downgrade_schema
from inference_auctions.billing.migrate import upgrade as upgrade_schema
from inference_auctions.billing.models import EntryKind, HoldState, RequestStatus
from inference_auctions.billing.money import (
    MAX_MICROS,
    MICROS_PER_CREDIT,
    format_micros,
    parse_credits,
)
from inference_auctions.billing.periods import Period
from inference_auctions.billing.replica_rules import ReplicaProcess
from inference_auctions.billing.schemas import (
    BalanceRecord,
    DriftRecord,
    EntryRecord,
    LedgerRecord,
    ReconcileRecord,
    SummaryRecord,
)
from inference_auctions.billing.settings import LedgerSettings
from inference_auctions.billing.settlement import BatchClaim
from inference_auctions.billing.views import (
    BalanceView,
    ClaimedBatch,
    CreatedUser,
    DriftView,
    EntryPage,
    EntryView,
    HoldView,
    PricedRequestView,
    ReconcileView,
    RefundResult,
    RequestView,
    RolloverResult,
    SettleResult,
    SummaryView,
    UserInfo,
)

__all__ = [
    "MAX_MICROS",
    "MICROS_PER_CREDIT",
    "AccountActivity",
    "AdminActionView",
    "ApiKeyView",
    "BalanceRecord",
    "BalanceView",
    "BatchCapExceeded",
    "BatchClaim",
    "BatchInput",
    "ChargeExceedsHold",
    "ClaimedBatch",
    "ClearingPoint",
    "ClearingSample",
    "CompletionInput",
    "CreatedUser",
    "DriftRecord",
    "DriftView",
    "DuplicateApiKey",
    "DuplicateUser",
    "EntryKind",
    "EntryPage",
    "EntryRecord",
    "EntryView",
    "GroupOutcome",
    "HoldInput",
    "HoldNotOpen",
    "HoldState",
    "HoldView",
    "IdempotencyConflict",
    "InsufficientFunds",
    "InvalidAmount",
    "InvalidBatch",
    "InvalidInput",
    "IssuedKey",
    "Ledger",
    "LedgerError",
    "LedgerJobs",
    "LedgerRecord",
    "LedgerSettings",
    "LedgerUnavailable",
    "MarketActivity",
    "Period",
    "PrefixSquatter",
    "PricedRequestView",
    "ReconcileRecord",
    "ReconcileView",
    "RefundExceedsCharge",
    "RefundResult",
    "ReplicaProcess",
    "RequestInput",
    "RequestNotScheduled",
    "RequestStatus",
    "RequestView",
    "RolloverResult",
    "RuleDisagreement",
    "ServedInput",
    "SettleResult",
    "SpendView",
    "Spender",
    "SummaryRecord",
    "SummaryView",
    "UnknownApiKey",
    "UnknownBatch",
    "UnknownRequest",
    "UnknownUser",
    "UserDisabled",
    "UserInfo",
    "check_database_url",
    "client_rid",
    "describe_drift",
    "downgrade_schema",
    "format_micros",
    "head_revision",
    "hold_micros",
    "mask_database_url",
    "parse_credits",
    "probe_database",
    "request_key",
    "schema_drift",
    "schema_revision",
    "sqlite_busy_timeout_seconds",
    "sqlite_file",
    "start_ledger_jobs",
    "start_scheduler",
    "upgrade_schema",
]
