"""Client SDK of the inference auction: send prompts with what priority is worth to you.

The client turns values into bids under a budget with a pacing autobidder, retries safely
(every request's id is its idempotency key), and reads the account's ledger.
"""

from ._base_client import BudgetExhaustedWarning, RawResponse
from ._budget import Budget
from ._client import AsyncAuctionClient, AuctionClient
from ._exceptions import (
    APIConnectionError,
    APIError,
    APIResponseValidationError,
    APIStatusError,
    APITimeoutError,
    AuctionError,
    AuthenticationError,
    BadRequestError,
    BudgetExhaustedError,
    ClientClosedError,
    ConfigurationError,
    ConflictError,
    EngineError,
    EngineTimeoutError,
    IdempotencyConflictError,
    InsufficientFundsError,
    InternalServerError,
    InvalidAmountError,
    NotFoundError,
    PermissionDeniedError,
    RateLimitError,
    ServiceUnavailableError,
    StreamError,
    UnprocessableEntityError,
)
from ._ledger import AsyncLedger, AsyncMarket, AsyncModels, Ledger, Market, Models
from ._models import (
    Auction,
    Balance,
    BudgetPeriod,
    ChatChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChatMessage,
    ChoiceDelta,
    ChunkChoice,
    Completion,
    CompletionChoice,
    Generation,
    LedgerEntry,
    LedgerPage,
    LedgerSummary,
    LedgerSummaryRow,
    MarketPrices,
    MarketRule,
    Model,
    ModelList,
    PriceBand,
    PricePerPriority,
    Spend,
    Tier,
    TierMenu,
    Usage,
)
from ._money import format_credits, to_micros
from ._pacing import PacingBidder
from ._streaming import AsyncChatCompletionStream, AsyncStream, ChatCompletionStream, Stream
from ._tiers import choose_tier, expected_gain_micros
from ._types import NOT_GIVEN, NotGiven
from ._version import __version__

__all__ = [
    "NOT_GIVEN",
    "APIConnectionError",
    "APIError",
    "APIResponseValidationError",
    "APIStatusError",
    "APITimeoutError",
    "AsyncAuctionClient",
    "AsyncChatCompletionStream",
    "AsyncLedger",
    "AsyncMarket",
    "AsyncModels",
    "AsyncStream",
    "Auction",
    "AuctionClient",
    "AuctionError",
    "AuthenticationError",
    "BadRequestError",
    "Balance",
    "Budget",
    "BudgetExhaustedError",
    "BudgetExhaustedWarning",
    "BudgetPeriod",
    "ChatChoice",
    "ChatCompletion",
    "ChatCompletionChunk",
    "ChatCompletionStream",
    "ChatMessage",
    "ChoiceDelta",
    "ChunkChoice",
    "ClientClosedError",
    "Completion",
    "CompletionChoice",
    "ConfigurationError",
    "ConflictError",
    "EngineError",
    "EngineTimeoutError",
    "Generation",
    "IdempotencyConflictError",
    "InsufficientFundsError",
    "InternalServerError",
    "InvalidAmountError",
    "Ledger",
    "LedgerEntry",
    "LedgerPage",
    "LedgerSummary",
    "LedgerSummaryRow",
    "Market",
    "MarketPrices",
    "MarketRule",
    "Model",
    "ModelList",
    "Models",
    "NotFoundError",
    "NotGiven",
    "PacingBidder",
    "PermissionDeniedError",
    "PriceBand",
    "PricePerPriority",
    "RateLimitError",
    "RawResponse",
    "ServiceUnavailableError",
    "Spend",
    "Stream",
    "StreamError",
    "Tier",
    "TierMenu",
    "UnprocessableEntityError",
    "Usage",
    "__version__",
    "choose_tier",
    "expected_gain_micros",
    "format_credits",
    "to_micros",
]

# Public classes report the package, not the private module, as their home.
for _name in __all__:
    _obj = globals()[_name]
    if isinstance(_obj, type) and _obj.__module__.startswith("inference_auctions.sdk._"):
        _obj.__module__ = __name__
del _name, _obj
