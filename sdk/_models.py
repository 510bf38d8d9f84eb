"""Typed response bodies. Unknown fields are kept, so a newer server never breaks an older SDK."""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator, model_validator

from ._constants import MICROS_PER_CREDIT

__all__ = [
    "Auction",
    "AuctionOutlook",
    "Balance",
    "BudgetPeriod",
    "ChatChoice",
    "ChatCompletion",
    "ChatCompletionChunk",
    "ChatMessage",
    "ChoiceDelta",
    "ChunkChoice",
    "Completion",
    "CompletionChoice",
    "Generation",
    "LedgerEntry",
    "LedgerPage",
    "LedgerSummary",
    "LedgerSummaryRow",
    "MarketPool",
    "MarketPrices",
    "MarketRule",
    "Model",
    "ModelList",
    "PriceBand",
    "PriceFloor",
    "PricePerPriority",
    "Spend",
    "Tier",
    "TierMenu",
    "Usage",
]


def credits(micros: int | None) -> Decimal | None:
    """Micro-credits as exact credits (None stays None)."""
    return None if micros is None else Decimal(micros) / MICROS_PER_CREDIT


class _Model(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True)
    _request_id: str | None = PrivateAttr(default=None)

    @property
    def request_id(self) -> str | None:
        """The server's `x-request-id` of the response this came from, if any."""
        return self._request_id


class Auction(_Model):
    """How a request fared in its batch's auction.

    Charges are non-negative amounts the user pays. `user_batch_charge_micros` is the user's
    whole charge for the batch (the same on each of the user's requests in it: never sum it over
    requests); `request_charge_micros` is this request's share, and the shares of the user's
    requests in a batch sum to the user's charge. A server that sends only `charge_micros` (the
    old name of the batch charge) gives it for both.
    """

    batch_id: str
    position: int
    """0-based place in the batch's schedule; 0 is served first."""
    batch_size: int
    priority: float
    """Fractional priority `(n-1-position)/(n-1)`."""
    bid_micros: int
    user_batch_charge_micros: int
    """The user's total charge for the whole batch (all of its requests there together)."""
    request_charge_micros: int
    """This request's share of the user's batch charge."""
    charge_micros: int
    """Deprecated alias of `user_batch_charge_micros`, kept for one release."""
    request_fee_micros: int = 0
    """The request fee this request pays besides its charge (0 when the server has none);
    given back if the request fails."""
    floor_micros: int = 0
    """Under a posted price floor, what this request pays of the floor besides its charge (0
    when the server runs none, and for a request that waited outside); given back if the
    request fails."""
    per_request_charges: bool = Field(default=False, repr=False)
    """Whether the server sent `request_charge_micros` (else it repeats the batch charge)."""

    @model_validator(mode="before")
    @classmethod
    def _fill_charges(cls, data: Any) -> Any:
        if not isinstance(data, dict) or "per_request_charges" in data:
            return data
        batch = data.get("user_batch_charge_micros", data.get("charge_micros"))
        return {
            **data,
            "user_batch_charge_micros": batch,
            "charge_micros": data.get("charge_micros", batch),
            "request_charge_micros": data.get("request_charge_micros", batch),
            "per_request_charges": "request_charge_micros" in data,
        }

    @property
    def bid(self) -> Decimal:
        """The bid in credits."""
        return Decimal(self.bid_micros) / MICROS_PER_CREDIT

    @property
    def user_batch_charge(self) -> Decimal:
        """The user's whole charge for the batch, in credits."""
        return Decimal(self.user_batch_charge_micros) / MICROS_PER_CREDIT

    @property
    def request_charge(self) -> Decimal:
        """This request's share of the batch charge, in credits."""
        return Decimal(self.request_charge_micros) / MICROS_PER_CREDIT

    @property
    def charge(self) -> Decimal:
        """Deprecated alias of `user_batch_charge`."""
        return Decimal(self.charge_micros) / MICROS_PER_CREDIT

    @property
    def request_fee(self) -> Decimal:
        """The request fee this request pays, in credits."""
        return Decimal(self.request_fee_micros) / MICROS_PER_CREDIT


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


def finish_type(detail: dict[str, Any] | None) -> str | None:
    """SGLang's `{"type": "stop", ...}` finish reason as the string chat completions use."""
    if detail is None:
        return None
    kind = detail.get("type")
    return kind if isinstance(kind, str) else None


class Generation(_Model):
    """The result of `generate`."""

    rid: str
    text: str
    output_ids: list[int] = Field(default_factory=list)
    finish_reason: str | None = None
    """Why generation stopped, as in chat completions: "stop", "length", "abort"."""
    finish_reason_detail: dict[str, Any] | None = None
    """SGLang's whole finish reason object (e.g. which stop string matched)."""
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


class ChoiceDelta(_Model):
    """What one streamed chunk adds to a choice's message."""

    role: str | None = None
    content: str | None = None


class ChunkChoice(_Model):
    """One choice of a streamed chunk."""

    index: int = 0
    delta: ChoiceDelta = ChoiceDelta()
    finish_reason: str | None = None


class ChatCompletionChunk(_Model):
    """One event of a streamed chat completion, as OpenAI's `chat.completion.chunk`, with the
    `auction` (the first chunk comes as soon as the batch clears)."""

    id: str
    object: str = "chat.completion.chunk"
    created: int = 0
    model: str = ""
    choices: list[ChunkChoice] = []
    usage: Usage | None = None
    auction: Auction | None = None

    @property
    def text(self) -> str:
        """The first choice's new content ("" when the chunk adds none)."""
        return (self.choices[0].delta.content or "") if self.choices else ""


class CompletionChoice(_Model):
    """One choice of a text completion."""

    index: int = 0
    text: str
    finish_reason: str | None = None


class Completion(_Model):
    """An OpenAI-shaped text completion with the auction outcome attached."""

    id: str
    object: str = "text_completion"
    created: int = 0
    model: str = ""
    choices: list[CompletionChoice]
    usage: Usage | None = None
    auction: Auction | None = None

    @property
    def text(self) -> str:
        """The first choice's text."""
        return self.choices[0].text if self.choices else ""


class Model(_Model):
    """A model the server serves."""

    id: str
    object: str = "model"
    created: int = 0
    owned_by: str = ""


class ModelList(_Model):
    """`GET /v1/models`."""

    object: str = "list"
    data: list[Model]


class Balance(_Model):
    """The account's balance and this period's spend (all non-negative amounts)."""

    user: str
    balance_micros: int
    held_micros: int
    available_micros: int
    spent_this_period_micros: int
    """Charges net of refunds in the current period: what the user paid, positive."""
    period: Literal["none", "day", "week", "month"]
    period_start: datetime | None = None
    period_end: datetime | None = None
    """When the period ends and the next grant comes; None for a lifetime budget."""

    @property
    def balance(self) -> Decimal:
        """The balance in credits."""
        return Decimal(self.balance_micros) / MICROS_PER_CREDIT

    @property
    def held(self) -> Decimal:
        """Bids held for requests in flight, in credits."""
        return Decimal(self.held_micros) / MICROS_PER_CREDIT

    @property
    def available(self) -> Decimal:
        """Balance less holds, in credits."""
        return Decimal(self.available_micros) / MICROS_PER_CREDIT

    @property
    def spent_this_period(self) -> Decimal:
        """This period's net spend, in credits."""
        return Decimal(self.spent_this_period_micros) / MICROS_PER_CREDIT


class BudgetPeriod(_Model):
    """The user's budget period on the server: the grant, spend so far, time left.

    Every process of the user reads the same figures, so all derive the same pacing target.
    """

    user: str
    period: Literal["none", "day", "week", "month"]
    timezone: str = "UTC"
    period_start: datetime
    period_end: datetime | None = None
    """None for a lifetime grant, which has no end to pace towards."""
    now: datetime
    seconds_left: float | None = None
    grant_micros: int
    spent_micros: int
    """Charges and request fees net of refunds in this period, positive."""
    remaining_micros: int
    """`grant - spent`, never below 0."""
    balance_micros: int
    held_micros: int
    available_micros: int
    auctions: int
    """Batches of this period that held at least one of the user's requests."""
    request_fee_micros: int = 0
    """The fee every request pays besides its charge, zero bids included."""

    @property
    def grant(self) -> Decimal:
        """The grant of the period, in credits."""
        return Decimal(self.grant_micros) / MICROS_PER_CREDIT

    @property
    def spent(self) -> Decimal:
        """Spent so far this period, in credits."""
        return Decimal(self.spent_micros) / MICROS_PER_CREDIT

    @property
    def remaining(self) -> Decimal:
        """What is left of the grant, in credits."""
        return Decimal(self.remaining_micros) / MICROS_PER_CREDIT

    @property
    def balance(self) -> Decimal:
        """The balance in credits."""
        return Decimal(self.balance_micros) / MICROS_PER_CREDIT

    @property
    def held(self) -> Decimal:
        """Bids held for requests in flight, in credits."""
        return Decimal(self.held_micros) / MICROS_PER_CREDIT

    @property
    def available(self) -> Decimal:
        """Balance less holds, in credits."""
        return Decimal(self.available_micros) / MICROS_PER_CREDIT


class Spend(_Model):
    """The user's spend (charges and request fees net of refunds, positive) and auctions since
    a moment."""

    since: datetime
    now: datetime
    spent_micros: int
    held_micros: int
    auctions: int
    request_fee_micros: int = 0
    """The fee every request pays besides its charge (counted in `spent_micros` once paid)."""

    @property
    def spent(self) -> Decimal:
        """Spent since `since`, in credits."""
        return Decimal(self.spent_micros) / MICROS_PER_CREDIT

    @property
    def held(self) -> Decimal:
        """Bids held for requests in flight now, in credits."""
        return Decimal(self.held_micros) / MICROS_PER_CREDIT


class PricePerPriority(_Model):
    """Recent charge per unit of priority (a whole batch's schedule is 1), in micro-credits."""

    mean: int | None = None
    p10: int | None = None
    p50: int | None = None
    p90: int | None = None

    @property
    def mean_credits(self) -> Decimal | None:
        """The charge-weighted mean, in credits."""
        return credits(self.mean)

    @property
    def p10_credits(self) -> Decimal | None:
        """The 10th percentile, in credits."""
        return credits(self.p10)

    @property
    def p50_credits(self) -> Decimal | None:
        """The median, in credits."""
        return credits(self.p50)

    @property
    def p90_credits(self) -> Decimal | None:
        """The 90th percentile, in credits."""
        return credits(self.p90)


class PriceBand(_Model):
    """What one request placed with priority in `[priority_min, priority_max)` recently cost."""

    priority_min: float
    priority_max: float
    samples: int
    median_charge_micros: int | None = None
    p90_charge_micros: int | None = None

    @property
    def median_charge(self) -> Decimal | None:
        """The median charge of one request in this band, in credits."""
        return credits(self.median_charge_micros)

    @property
    def p90_charge(self) -> Decimal | None:
        """The 90th percentile charge of one request in this band, in credits."""
        return credits(self.p90_charge_micros)


class MarketPrices(_Model):
    """What places in the queue have recently cost, from the server's cleared batches."""

    since: datetime
    until: datetime
    batches: int
    samples: int
    charge_per_priority_micros: PricePerPriority
    by_priority: list[PriceBand]
    request_fee_micros: int = 0
    """The fee every request pays on top of these charges, zero bids included."""

    @property
    def request_fee(self) -> Decimal:
        """The request fee, in credits."""
        return Decimal(self.request_fee_micros) / MICROS_PER_CREDIT


class PriceFloor(_Model):
    """The posted price floor under the rolling auction (`MarketRule.price_floor`).

    A request whose bid is below `micros` waits outside the auction: it is served only when no
    bid at or above the floor waits, and pays nothing. An entrant dispatched pays the floor plus
    its rolling charge, capped at what its bid says its delay is worth. The floor moves after
    every clearing towards keeping `target` entrants waiting. `mode` "off" (or an older server,
    which sends no floor): no floor, `micros` and `target` None.
    """

    mode: Literal["off", "posted"] = "off"
    micros: int | None = None
    """The floor in force when it was read, in micro-credits; None when off."""
    target: int | None = None
    """The entrants waiting that the floor steers towards; None when off."""

    @property
    def posted(self) -> bool:
        """Whether a floor is in force."""
        return self.mode == "posted" and self.micros is not None

    @property
    def floor(self) -> Decimal | None:
        """The floor in credits (None when off)."""
        return credits(self.micros) if self.posted else None


class MarketRule(_Model):
    """The pricing rule the server clears every batch under (`GET /v1/market/rule`).

    `pricing` is the server's mode: `auction` (bids), `tiers` (fixed prices, `market.tiers()`)
    or `fcfs` (first come, first served; bids ignored, nothing charged).

    `priority_slots` is the K every batch is priced in (a bid `b` is worth `b/(K-1)` per slot
    of delay); None under `batch-size`, where K is each batch's own size. `request_fee_micros`
    is what every request pays besides its VCG charge, zero bids included.
    """

    pricing_rule: Literal["rolling-slots", "fixed-slots", "batch-size", "tiers", "fcfs"]
    priority_slots: int | None = None
    batch_size: int
    request_fee_micros: int = 0
    pricing: Literal["auction", "tiers", "fcfs"] = "auction"
    price_floor: PriceFloor = PriceFloor()
    """The posted price floor; mode "off" when the server has none (or predates floors)."""

    @field_validator("price_floor", mode="before")
    @classmethod
    def _no_floor_is_off(cls, value: Any) -> Any:
        return {} if value is None else value

    @property
    def request_fee(self) -> Decimal:
        """The request fee, in credits."""
        return Decimal(self.request_fee_micros) / MICROS_PER_CREDIT


class MarketPool(_Model):
    """The rolling auction's waiting pool now (`GET /v1/market/pool`).

    `entrants` wait in the auction (bids at or above the floor), `outside` wait below it;
    `ahead` is how many entrants the asked bid would not overtake (None when no bid was
    asked); `starts_per_second` is the engine's recent rate of request starts.
    """

    price_floor_micros: int | None = None
    """The floor in force; None when the server posts none."""
    entrants: int
    outside: int
    ahead: int | None = None
    starts_per_second: float


class AuctionOutlook(_Model):
    """Where a request worth `value` would stand if sent now (`client.auction_outlook`).

    `bid_micros` is the bid the pacing would send for it now; `clears_floor` says whether that
    bid enters the auction (at or above the floor; with no floor, any bid above 0).
    `entrants`, `outside`, `ahead` and `starts_per_second` are the server's pool figures (None
    on a server without `GET /v1/market/pool`). `expected_wait_seconds` is `ahead /
    starts_per_second` for a bid that clears the floor, None when unknown: no pool figures, no
    starts recently, or a bid below the floor, which waits until no entrant does.
    """

    value_micros: int
    bid_micros: int
    price_floor_micros: int | None = None
    """The floor in force (None: no floor posted)."""
    clears_floor: bool
    entrants: int | None = None
    outside: int | None = None
    ahead: int | None = None
    starts_per_second: float | None = None
    expected_wait_seconds: float | None = None

    @property
    def value(self) -> Decimal:
        """The value asked about, in credits."""
        return Decimal(self.value_micros) / MICROS_PER_CREDIT

    @property
    def bid(self) -> Decimal:
        """The bid the pacing would send, in credits."""
        return Decimal(self.bid_micros) / MICROS_PER_CREDIT

    @property
    def price_floor(self) -> Decimal | None:
        """The floor in force, in credits (None: no floor posted)."""
        return credits(self.price_floor_micros)


class Tier(_Model):
    """One tier a `--pricing tiers` server sells (`GET /v1/market/tiers`).

    `price_micros` is what each request in it pays; `rank` 0 is served first;
    `expected_priority_ppm` is the mean share, in parts per million, of their competitors (the
    requests whose waits overlapped theirs) that its recent requests went ahead of, drawn from
    `samples` of them (0: an even split of the pool by tier, before any traffic);
    `recent_wait_ms` is the median wait of those requests from arrival to dispatch to the
    engine (None before any, or from a server that does not publish it).
    """

    name: str
    price_micros: int
    rank: int
    expected_priority_ppm: int
    samples: int = 0
    recent_wait_ms: int | None = None


class TierMenu(_Model):
    """The tiers a `--pricing tiers` server sells, dearest first, and the default one."""

    default_tier: str
    tiers: list[Tier]


class LedgerEntry(_Model):
    """One row of the ledger.

    `amount_micros` is signed as the entry moves the balance: grants and refunds are positive,
    charges negative, a `fee` negative when paid and positive when given back for a failed
    request, a `floor` (the price floor's part of a charge, booked beside its `charge` entry)
    negative like a charge (a hold or release moves held money: a hold is positive, its
    release negative).
    `rid` is the request id as the client sent it.
    """

    id: int
    kind: Literal["grant", "hold", "release", "charge", "refund", "adjustment", "fee", "floor"]
    amount_micros: int
    batch_id: str | None = None
    rid: str | None = None
    reason: str | None = None
    created_at: datetime

    @property
    def amount(self) -> Decimal:
        """The signed amount in credits."""
        return Decimal(self.amount_micros) / MICROS_PER_CREDIT


class LedgerPage(_Model):
    """A page of ledger entries; pass `next_cursor` back for the next one."""

    entries: list[LedgerEntry]
    next_cursor: str | None = None


class LedgerSummaryRow(_Model):
    """Totals over one day, week or month.

    `charged`, `refunded` and `granted` are magnitudes (never negative: what was charged is
    reported as a positive amount), and so are `fees` and `floors`, the request fees and the
    price floors paid net of those given back; `adjusted` and `net` are signed as they move the
    balance, like `LedgerEntry.amount_micros`, so
    `net = granted - charged + refunded + adjusted - fees - floors`.
    """

    period_start: datetime
    charged_micros: int
    refunded_micros: int
    granted_micros: int
    adjusted_micros: int = 0
    fees_micros: int = 0
    floors_micros: int = 0
    net_micros: int | None = None
    requests: int | None = None
    entries: int | None = None

    @property
    def charged(self) -> Decimal:
        """Charged in the period, in credits (positive)."""
        return Decimal(self.charged_micros) / MICROS_PER_CREDIT

    @property
    def refunded(self) -> Decimal:
        """Refunded in the period, in credits (positive)."""
        return Decimal(self.refunded_micros) / MICROS_PER_CREDIT

    @property
    def granted(self) -> Decimal:
        """Granted in the period, in credits (positive)."""
        return Decimal(self.granted_micros) / MICROS_PER_CREDIT

    @property
    def adjusted(self) -> Decimal:
        """Adjustments in the period, in credits (signed)."""
        return Decimal(self.adjusted_micros) / MICROS_PER_CREDIT

    @property
    def fees(self) -> Decimal:
        """Request fees paid in the period, net of those given back, in credits (positive)."""
        return Decimal(self.fees_micros) / MICROS_PER_CREDIT

    @property
    def floors(self) -> Decimal:
        """Price floors paid in the period, net of those given back, in credits (positive)."""
        return Decimal(self.floors_micros) / MICROS_PER_CREDIT

    @property
    def net(self) -> Decimal | None:
        """The net balance movement in the period, in credits (signed)."""
        return credits(self.net_micros)


class LedgerSummary(_Model):
    """Ledger totals grouped by period."""

    by: Literal["day", "week", "month"]
    rows: list[LedgerSummaryRow]
