"""Everything the sync and async clients share that does no network I/O.

Configuration, request bodies, the retry policy, error mapping, and the glue between HTTP
responses and the pacing bidder all live here; the two clients only send and sleep.
"""

from __future__ import annotations

import copy
import email.utils
import os
import random
import threading
import time
import warnings
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Generic, Literal, TypeAlias, TypeVar

import httpx
import pydantic

from . import _constants
from ._budget import Budget
from ._constants import API_KEY_ENV, BASE_URL_ENV
from ._exceptions import (
    IDEMPOTENCY_CONFLICT,
    APIConnectionError,
    APIResponseValidationError,
    APITimeoutError,
    BudgetExhaustedError,
    ClientClosedError,
    ConfigurationError,
    error_type,
)
from ._floor import FloorWatch, outlook
from ._logs import logger, setup_logging
from ._models import (
    AuctionOutlook,
    BudgetPeriod,
    ChatCompletion,
    ChatMessage,
    Completion,
    GenerateResponse,
    Generation,
    MarketPool,
    PriceFloor,
    Spend,
    _Model,
    finish_type,
)
from ._money import format_credits, to_micros
from ._pacing import PacingBidder, SyncMarker
from ._settlement import Settlement
from ._state_file import load_state, save_state
from ._types import NOT_GIVEN, Money, NotGiven, TimeoutTypes
from ._version import __version__

__all__ = [
    "BaseClient",
    "BudgetExhaustedWarning",
    "Call",
    "ChatMessageParam",
    "OnBudgetExhausted",
    "RawResponse",
    "RequestOptions",
]

ChatMessageParam = Mapping[str, Any] | ChatMessage
OnBudgetExhausted: TypeAlias = Literal["raise", "bid_zero"]
_T = TypeVar("_T")
_M = TypeVar("_M", bound=pydantic.BaseModel)
_R = TypeVar("_R")


def new_rid() -> str:
    """A fresh rid: 32 hex digits, a millisecond clock (48 bits) then 80 random bits.

    Ordered by time (like a UUIDv7) because the server's ledger keys rows by rid: rids that
    grow insert at the right edge of its indexes, where random ones would touch a page per
    request (the server makes its own rids the same way). The random part keeps them
    unguessable and unique across processes.
    """
    return f"{time.time_ns() // 1_000_000:012x}{os.urandom(10).hex()}"


class BudgetExhaustedWarning(UserWarning):
    """A request was sent at bid 0 because the budget of its period is spent."""


@dataclass(frozen=True)
class RequestOptions:
    """Per-call overrides, as openai-python takes them."""

    extra_headers: Mapping[str, str] | None = None
    extra_query: Mapping[str, str | int] | None = None
    extra_body: Mapping[str, Any] | None = None
    max_retries: int | NotGiven = NOT_GIVEN
    timeout: TimeoutTypes | NotGiven = NOT_GIVEN


class RawResponse(Generic[_R]):
    """An HTTP response with its parsed result: status, headers and the server's request id."""

    def __init__(self, response: httpx.Response, parsed: _R) -> None:
        self.http_response = response
        self._parsed = parsed

    @property
    def status_code(self) -> int:
        """The HTTP status code."""
        return self.http_response.status_code

    @property
    def headers(self) -> httpx.Headers:
        """The response headers."""
        return self.http_response.headers

    @property
    def request_id(self) -> str | None:
        """The server's `x-request-id`."""
        value: str | None = self.http_response.headers.get("x-request-id")
        return value

    def parse(self) -> _R:
        """The result the plain call would have returned."""
        return self._parsed


@dataclass(frozen=True)
class Call:
    """A request ready to send: its body (identical on every retry) and its reservation."""

    rid: str
    body: dict[str, Any]
    settlement: Settlement


class BaseClient:
    """Configuration and non-I/O logic shared by `AuctionClient` and `AsyncAuctionClient`."""

    _owns_http: bool

    def __init__(
        self,
        *,
        base_url: str | httpx.URL | None,
        api_key: str | None,
        budget: Budget | None,
        timeout: TimeoutTypes | NotGiven,
        max_retries: int,
        state_file: str | os.PathLike[str] | None,
        sync_on_start: bool,
        sync_interval: float | None,
        on_budget_exhausted: OnBudgetExhausted,
        default_headers: Mapping[str, str] | None,
        clock: Callable[[], float],
        client_timeout: TimeoutTypes,
    ) -> None:
        setup_logging()
        base_url = base_url or os.environ.get(BASE_URL_ENV)
        if not base_url:
            raise ConfigurationError(f"pass base_url= or set {BASE_URL_ENV}")
        api_key = api_key or os.environ.get(API_KEY_ENV)
        if not api_key:
            raise ConfigurationError(f"pass api_key= or set {API_KEY_ENV}")
        if max_retries < 0:
            raise ConfigurationError("max_retries must not be negative")
        if on_budget_exhausted not in ("raise", "bid_zero"):
            raise ConfigurationError("on_budget_exhausted must be 'raise' or 'bid_zero'")
        if sync_interval is not None and not sync_interval > 0:
            raise ConfigurationError("sync_interval must be positive (or None: never)")
        # A trailing slash makes relative joins keep any path prefix of the base URL.
        url = httpx.URL(str(base_url))
        self._base_url = url if url.raw_path.endswith(b"/") else httpx.URL(f"{url}/")
        self._api_key = api_key
        self._timeout: TimeoutTypes = client_timeout if isinstance(timeout, NotGiven) else timeout
        self._max_retries = max_retries
        self._default_headers = dict(default_headers or {})
        self._on_exhausted: OnBudgetExhausted = on_budget_exhausted
        # Without a Budget the plan is the user's budget period on the server, which only
        # the server knows: syncing with it is not optional then.
        self._server_period = budget is None
        self._sync_on_start = sync_on_start or self._server_period
        self._sync_interval = sync_interval if self._sync_on_start else None
        self._synced = False
        self._last_sync = 0.0
        self._state_path = None if state_file is None else Path(state_file)
        self._state_lock = threading.Lock()
        self._state_written = -1
        # Shared with `with_options` copies, like the bidder.
        self._floor = FloorWatch()
        pacing = budget if budget is not None else Budget(total=0, period=timedelta(days=1))
        state = None if self._state_path is None else load_state(self._state_path)
        if state is None:
            self._bidder = PacingBidder(pacing, clock=clock, server_period=self._server_period)
        else:
            self._bidder = PacingBidder.from_state(
                pacing, state, clock=clock, server_period=self._server_period
            )

    @property
    def base_url(self) -> httpx.URL:
        """The server's base URL."""
        return self._base_url

    @property
    def bidder(self) -> PacingBidder:
        """The pacing state: `alpha`, `mu`, spend and what remains of the budget."""
        return self._bidder

    @property
    def price_floor(self) -> PriceFloor | None:
        """The posted price floor as read at the last ledger sync (or `auction_outlook`);
        None before the first read. Its mode is "off" on a server without a floor."""
        return self._floor.floor

    @property
    def budget_limited(self) -> bool:
        """Whether the budget holds bids below the values now (or is spent)."""
        return self._bidder.budget_limited

    @property
    def max_retries(self) -> int:
        """How many times a failed request is retried."""
        return self._max_retries

    @property
    def timeout(self) -> TimeoutTypes:
        """The default timeout of every request."""
        return self._timeout

    def __repr__(self) -> str:
        return f"{type(self).__name__}(base_url={str(self._base_url)!r})"

    def _copy_with(
        self,
        *,
        timeout: TimeoutTypes | NotGiven,
        max_retries: int | NotGiven,
        default_headers: Mapping[str, str] | None,
        on_budget_exhausted: OnBudgetExhausted | NotGiven,
    ) -> Any:
        """A shallow copy sharing the connection pool and the pacing state."""
        clone = copy.copy(self)
        if not isinstance(timeout, NotGiven):
            clone._timeout = timeout
        if not isinstance(max_retries, NotGiven):
            if max_retries < 0:
                raise ConfigurationError("max_retries must not be negative")
            clone._max_retries = max_retries
        if default_headers is not None:
            clone._default_headers = {**self._default_headers, **default_headers}
        if not isinstance(on_budget_exhausted, NotGiven):
            clone._on_exhausted = on_budget_exhausted
        # The copy does not own the pool: closing it must not close the original's.
        clone._owns_http = False
        clone._bind_resources()
        return clone

    def _bind_resources(self) -> None:
        """(Re)create the sub-resources (`ledger`, `models`, ...) bound to this instance."""
        raise NotImplementedError

    # -- requests ----------------------------------------------------------------------------

    def _url(self, path: str) -> httpx.URL:
        return self._base_url.join(path.lstrip("/"))

    def _headers(
        self, *, stream: bool = False, extra: Mapping[str, str] | None = None
    ) -> dict[str, str]:
        return {
            "Accept": "text/event-stream" if stream else "application/json",
            "User-Agent": f"inference-auctions-sdk/{__version__}",
            **self._default_headers,
            **(extra or {}),
            "Authorization": f"Bearer {self._api_key}",
        }

    def _timeout_for(self, timeout: TimeoutTypes | NotGiven) -> TimeoutTypes:
        return self._timeout if isinstance(timeout, NotGiven) else timeout

    def _retries_for(self, options: RequestOptions) -> int:
        if isinstance(options.max_retries, NotGiven):
            return self._max_retries
        if options.max_retries < 0:
            raise ConfigurationError("max_retries must not be negative")
        return options.max_retries

    def _check_open(self, closed: bool) -> None:
        if closed:
            raise ClientClosedError(
                "this client is closed; create a new one (or use it in a `with` block)"
            )

    @staticmethod
    def _log_retry(
        method: str, url: httpx.URL, delay: float, attempt: int, retries: int, why: str
    ) -> None:
        logger.info(
            "Retrying %s %s in %.2f s (retry %d of %d) after %s",
            method,
            url.path,
            delay,
            attempt + 1,
            retries,
            why,
        )

    # -- retry policy ------------------------------------------------------------------------

    @staticmethod
    def _should_retry(response: httpx.Response) -> bool:
        """Whether a failed response is worth another attempt (its body must be read)."""
        status = response.status_code
        if status == 409:
            # The rid was used with another payload: retrying cannot help and must not hide it.
            return error_type(response) != IDEMPOTENCY_CONFLICT
        return status in (408, 429) or status >= 500

    @staticmethod
    def _retry_delay(attempt: int, response: httpx.Response | None) -> float:
        """Seconds to wait before retry number `attempt + 1`."""
        if response is not None:
            retry_after = _retry_after(response.headers)
            if retry_after is not None and 0 < retry_after <= _constants.MAX_RETRY_AFTER:
                return retry_after
        delay = min(_constants.INITIAL_RETRY_DELAY * 2.0**attempt, _constants.MAX_RETRY_DELAY)
        # Up to 25% less, so that clients failed by the same outage do not return in step.
        return delay * (1.0 - 0.25 * random.random())

    @staticmethod
    def _connection_error(
        exc: httpx.TransportError, request: httpx.Request, may_have_been_processed: bool
    ) -> APIConnectionError:
        cause = str(exc) or type(exc).__name__
        if isinstance(exc, httpx.TimeoutException):
            return APITimeoutError(
                request,
                message=f"Request timed out: {cause}",
                may_have_been_processed=may_have_been_processed,
            )
        return APIConnectionError(
            request,
            message=f"Connection error: {cause}",
            may_have_been_processed=may_have_been_processed,
        )

    @staticmethod
    def _may_have_reached_server(exc: httpx.TransportError) -> bool:
        return not isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout | httpx.PoolTimeout)

    # -- bids and bodies ---------------------------------------------------------------------

    def _place(
        self, value: Money, max_bid: Money | None, rid: str | None
    ) -> tuple[str, int, Settlement]:
        """Turn a value into a guarded bid and reserve it; say so when the budget is spent."""
        values = [to_micros(value, name="value")]
        cap = None if max_bid is None else to_micros(max_bid, name="max_bid")
        if self._bidder.exhausted:
            spent, total = self._bidder.spent_micros, self._bidder.total_micros
            message = (
                f"the budget is spent: {format_credits(spent)} of {format_credits(total)} "
                "credits in this period"
            )
            fee = self._bidder.request_fee_micros
            if self._on_exhausted == "raise" or fee:
                if fee:  # a bid of 0 is not free: it would pay the fee beyond the budget
                    message += f" (every request pays the server's fee of {format_credits(fee)})"
                raise BudgetExhaustedError(
                    message + "; nothing was sent (pass on_budget_exhausted='bid_zero' to "
                    "send at bid 0 instead)",
                    spent_micros=spent,
                    total_micros=total,
                )
            logger.warning("%s; sending at bid 0", message)
            # Five frames up is the caller of `generate`, `chat` or `completions.create`.
            warnings.warn(message + "; sending at bid 0", BudgetExhaustedWarning, stacklevel=5)
        elif self._floor.posted:
            # Warned before the bid is reserved (a warning turned into an error must not leave
            # it held); five frames up, as above. The bid still goes out as paced.
            preview = self._bidder.preview(values[0], max_bid=cap)
            self._floor.check(values[0], preview, stacklevel=5)
        fee = self._bidder.request_fee_micros
        (bid,) = self._bidder.bid(values, max_bid=cap)
        rid = rid or new_rid()
        # The fee is reserved with the bid (`PacingBidder.bid`) and freed with it.
        settlement = Settlement(
            self._bidder, rid=rid, reserved=bid + fee, on_change=self._save_state
        )
        return rid, bid, settlement

    def _generate_call(
        self,
        prompt: str,
        *,
        value: Money,
        stream: bool,
        sampling: Mapping[str, object | NotGiven],
        sampling_params: Mapping[str, Any] | None,
        max_bid: Money | None,
        rid: str | None,
        options: RequestOptions,
    ) -> Call:
        params = dict(sampling_params or {})
        params.update({k: v for k, v in sampling.items() if not isinstance(v, NotGiven)})
        rid, bid, settlement = self._place(value, max_bid, rid)
        body = {
            **(options.extra_body or {}),
            "text": prompt,
            "sampling_params": params,
            "rid": rid,
            "stream": stream,
            "bid": format_credits(bid),
        }
        return Call(rid=rid, body=body, settlement=settlement)

    def _openai_call(
        self,
        fields: Mapping[str, object | NotGiven],
        *,
        value: Money,
        stream: bool,
        max_bid: Money | None,
        rid: str | None,
        options: RequestOptions,
    ) -> Call:
        rid, bid, settlement = self._place(value, max_bid, rid)
        body: dict[str, Any] = dict(options.extra_body or {})
        body.update({k: v for k, v in fields.items() if not isinstance(v, NotGiven)})
        body.update(stream=stream, rid=rid, bid=format_credits(bid))
        return Call(rid=rid, body=body, settlement=settlement)

    @staticmethod
    def _chat_messages(messages: Iterable[ChatMessageParam]) -> list[dict[str, Any]]:
        return [
            m.model_dump(exclude_none=True) if isinstance(m, ChatMessage) else dict(m)
            for m in messages
        ]

    @staticmethod
    def _complete(call: Call, response: httpx.Response, parse: Callable[[object, Call], _T]) -> _T:
        """Parse a read 2xx response, settling the bid even when the body is unusable."""
        try:
            result = _validated(response, lambda payload: parse(payload, call))
        except BaseException as exc:
            # The server accepted the request, so it may well have charged it.
            call.settlement.fail(exc)
            raise
        if isinstance(result, _Model):
            result._request_id = response.headers.get("x-request-id")
        return result

    @staticmethod
    def _parse(response: httpx.Response, model: type[_M]) -> _M:
        """A read 2xx response as `model`."""
        result = _validated(response, model.model_validate)
        if isinstance(result, _Model):
            result._request_id = response.headers.get("x-request-id")
        return result

    @staticmethod
    def _generation(payload: object, call: Call) -> Generation:
        """Parse a `/generate` body and settle the bid with its charge."""
        raw = GenerateResponse.model_validate(payload)
        meta = raw.meta_info
        if meta.auction is None:
            raise ValueError("the response has no auction object")
        call.settlement.charged(meta.auction)
        return Generation(
            rid=call.rid,
            text=raw.text,
            output_ids=raw.output_ids,
            finish_reason=finish_type(meta.finish_reason),
            finish_reason_detail=meta.finish_reason,
            usage=meta.usage(),
            auction=meta.auction,
            e2e_latency=meta.e2e_latency,
            first_token_latency=meta.first_token_latency,
        )

    @staticmethod
    def _chat_completion(payload: object, call: Call) -> ChatCompletion:
        """Parse a chat completion and settle the bid with its charge."""
        completion = ChatCompletion.model_validate(payload)
        if completion.auction is None:
            call.settlement.unknown()
        else:
            call.settlement.charged(completion.auction)
        return completion

    @staticmethod
    def _text_completion(payload: object, call: Call) -> Completion:
        """Parse a text completion and settle the bid with its charge."""
        completion = Completion.model_validate(payload)
        if completion.auction is None:
            call.settlement.unknown()
        else:
            call.settlement.charged(completion.auction)
        return completion

    # -- ledger sync and the state file ------------------------------------------------------

    def _sync_due(self, now: float) -> bool:
        """Whether the ledger-wide figures are due for a refresh before the next bid."""
        if not self._synced:
            return self._sync_on_start
        if self._bidder.needs_sync:
            return True
        return self._sync_interval is not None and now - self._last_sync >= self._sync_interval

    def _sync_request(self) -> tuple[str, dict[str, str | int]]:
        """The path and query of the sync: the server period, or spend since the plan start."""
        if self._server_period:
            return "/v1/budget", {}
        return "/v1/spend", ledger_params(since=self._bidder.spend_since)

    def _apply_sync(self, marker: SyncMarker, payload: BudgetPeriod | Spend) -> None:
        """Take the user's ledger-wide figures as the spend of the plan or period."""
        if isinstance(payload, BudgetPeriod):
            if payload.period_end is None:
                raise ConfigurationError(
                    f"user {payload.user!r} has a lifetime grant on the server, with no period "
                    "to pace over: pass budget=Budget(total=..., auctions=...) instead"
                )
            self._bidder.set_request_fee(payload.request_fee_micros)
            self._bidder.sync_shared(
                marker=marker,
                spent_micros=payload.spent_micros,
                auctions=payload.auctions,
                window=(payload.period_start, payload.period_end),
                now=payload.now,
                total_micros=payload.grant_micros,
                held_micros=payload.held_micros,
            )
        else:
            window = self._bidder.window
            self._bidder.set_request_fee(payload.request_fee_micros)
            self._bidder.sync_shared(
                marker=marker,
                spent_micros=payload.spent_micros,
                auctions=payload.auctions,
                window=(payload.since, None if window is None else window[1]),
                now=payload.now,
                held_micros=payload.held_micros,
            )
        self._synced = True
        self._last_sync = time.monotonic()
        self._save_state()

    def _floor_failed(self, exc: Exception) -> None:
        """The floor's read with a sync failed: keep the last one."""
        # The floor only advises: a failed read must not fail the requests behind it.
        logger.warning("reading the price floor failed, keeping the last one: %s", exc)

    # -- the auction outlook -----------------------------------------------------------------

    def _outlook_bid(self, value: Money, max_bid: Money | None) -> tuple[int, int]:
        """The value in micro-credits and the bid the pacing would send for it now."""
        value_micros = to_micros(value, name="value")
        cap = None if max_bid is None else to_micros(max_bid, name="max_bid")
        return value_micros, self._bidder.preview(value_micros, max_bid=cap)

    def _outlook(
        self, value_micros: int, bid: int, pool: MarketPool | None, floor: PriceFloor | None
    ) -> AuctionOutlook:
        """The outlook from the pool's figures, or from the rule's floor alone (a server
        without the pool route); the fresh floor is kept for the warnings too."""
        if pool is not None:
            self._floor.update_level(pool.price_floor_micros)
            micros = pool.price_floor_micros
        else:
            floor = floor or PriceFloor()
            self._floor.update(floor)
            micros = floor.micros if floor.posted else None
        return outlook(value_micros, bid, micros, pool)

    def _sync_failed(self, exc: Exception) -> None:
        """A periodic sync failed: pace on local figures until the next one succeeds."""
        self._last_sync = time.monotonic()
        logger.warning("syncing spend with the ledger failed, retrying later: %s", exc)

    def _save_state(self) -> None:
        """Write the pacing state file, skipping snapshots older than the one on disk."""
        if self._state_path is None:
            return
        with self._state_lock:
            version = self._bidder.version
            if version <= self._state_written:
                return
            # A few hundred bytes: writing inline is cheaper than handing it to a thread,
            # even from the async client.
            save_state(self._state_path, self._bidder.to_state())
            self._state_written = version


def ledger_params(**params: object) -> dict[str, str | int]:
    """Query parameters without the ones left out; datetimes in ISO 8601."""
    out: dict[str, str | int] = {}
    for name, value in params.items():
        if value is None or isinstance(value, NotGiven):
            continue
        if isinstance(value, datetime):
            out[name] = value.isoformat()
        elif isinstance(value, int | str):
            out[name] = value
        else:
            raise TypeError(f"{name} must be a str, int or datetime")
    return out


def _validated(response: httpx.Response, parse: Callable[[Any], _T]) -> _T:
    try:
        payload = response.json()
    except ValueError as exc:
        raise APIResponseValidationError(response, body=response.text, detail=str(exc)) from exc
    try:
        return parse(payload)
    except (pydantic.ValidationError, ValueError) as exc:
        raise APIResponseValidationError(response, body=payload, detail=str(exc)) from exc


def _retry_after(headers: httpx.Headers) -> float | None:
    """Seconds from `Retry-After-Ms` or `Retry-After` (seconds or an HTTP date)."""
    millis = headers.get("retry-after-ms")
    if millis is not None:
        try:
            return float(millis) / 1000.0
        except ValueError:
            pass
    value = headers.get("retry-after")
    if value is None:
        return None
    try:
        return float(value)
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return when.timestamp() - time.time()
