"""Typed response bodies. Unknown fields are kept, so a newer server never breaks an older SDK."""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from ._constants import MICROS_PER_CREDIT

__all__ = [
    "Auction",
    "Balance",
    "ChatChoice",
    "ChatCompletion",
    "ChatMessage",
    "Generation",
    "LedgerEntry",
    "LedgerPage",
    "LedgerSummary",
    "LedgerSummaryRow",
    "Usage",
]


class _Model(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True)


class Auction(_Model):
    """How a request fared in its batch's auction."""

    batch_id: str
    position: int
    """0-based place in the batch's schedule; 0 is served first."""
    batch_size: int
    priority: float
    """Fractional priority `(n-1-position)/(n-1)`."""
    bid_micros: int
    charge_micros: int
    """The user's total charge for the whole batch (all of its requests there together)."""

    @property
    def bid(self) -> Decimal:
        """The bid in credits."""
        return Decimal(self.bid_micros) / MICROS_PER_CREDIT

    @property
    def charge(self) -> Decimal:
        """The batch charge in credits."""
        return Decimal(self.charge_micros) / MICROS_PER_CREDIT


class Usage(_Model):
    """Token counts of one request."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    cached_tokens: int = 0

    @model_validator(mode="before")
    @classmethod
    def _openai_cached_tokens(cls, data: Any) -> Any:
        # OpenAI-shaped bodies nest the cached count under `prompt_tokens_details`.
        if isinstance(data, dict) and "cached_tokens" not in data:
            details = data.get("prompt_tokens_details")
            if isinstance(details, dict) and isinstance(details.get("cached_tokens"), int):
                return {**data, "cached_tokens": details["cached_tokens"]}
        return data


class MetaInfo(_Model):
    """The `meta_info` object of an SGLang-native response (internal)."""

    id: str
    finish_reason: dict[str, Any] | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    e2e_latency: float | None = None
    first_token_latency: float | None = None
    auction: Auction | None = None

    def usage(self) -> Usage:
        """The token counts as a `Usage`."""
        return Usage(
            prompt_tokens=self.prompt_tokens,
            completion_tokens=self.completion_tokens,
            total_tokens=self.prompt_tokens + self.completion_tokens,
            cached_tokens=self.cached_tokens,
        )


class GenerateResponse(_Model):
    """The body of `POST /generate`, or one event of its stream (internal)."""

    text: str = ""
    output_ids: list[int] = Field(default_factory=list)
    meta_info: MetaInfo


class Generation(_Model):
    """The result of `generate`."""

    rid: str
    text: str
    output_ids: list[int] = Field(default_factory=list)
    finish_reason: dict[str, Any] | None = None
    usage: Usage
    auction: Auction
    e2e_latency: float | None = None
    first_token_latency: float | None = None


class ChatMessage(_Model):
    """One message of a chat completion."""

    role: str
    content: str | None = None


class ChatChoice(_Model):
    """One choice of a chat completion."""

    index: int = 0
    message: ChatMessage
    finish_reason: str | None = None


class ChatCompletion(_Model):
    """An OpenAI-shaped chat completion with the auction outcome attached."""

    id: str
    object: str = "chat.completion"
    created: int = 0
    model: str = ""
    choices: list[ChatChoice]
    usage: Usage | None = None
    auction: Auction | None = None

    @property
    def text(self) -> str:
        """The first choice's content."""
        return (self.choices[0].message.content or "") if self.choices else ""


class Balance(_Model):
    """The account's balance and this period's spend."""

    user: str
    balance_micros: int
    held_micros: int
    available_micros: int
    spent_this_period_micros: int
    period: Literal["none", "day", "week", "month"]
    period_start: datetime | None = None


class LedgerEntry(_Model):
    """One row of the ledger."""

    id: int
    kind: Literal["grant", "hold", "release", "charge", "refund", "adjustment"]
    amount_micros: int
    batch_id: str | None = None
    rid: str | None = None
    reason: str | None = None
    created_at: datetime


class LedgerPage(_Model):
    """A page of ledger entries; pass `next_cursor` back for the next one."""

    entries: list[LedgerEntry]
    next_cursor: str | None = None


class LedgerSummaryRow(_Model):
    """Totals over one day, week or month."""

    period_start: datetime
    charged_micros: int
    refunded_micros: int
    granted_micros: int
    adjusted_micros: int = 0
    net_micros: int | None = None
    requests: int | None = None
    entries: int | None = None


class LedgerSummary(_Model):
    """Ledger totals grouped by period."""

    by: Literal["day", "week", "month"]
    rows: list[LedgerSummaryRow]
