"""Everything the sync and async clients share that does no network I/O.

Configuration, request bodies, the retry policy, error mapping, and the glue between HTTP
responses and the pacing bidder all live here; the two clients only send and sleep.
"""

from __future__ import annotations

import email.utils
import os
import random
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

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
    ConfigurationError,
    error_type,
)
from ._models import (
    Balance,
    ChatCompletion,
    ChatMessage,
    GenerateResponse,
    Generation,
    LedgerEntry,
)
from ._money import format_credits, to_micros
from ._pacing import PacingBidder
from ._settlement import Settlement
from ._state_file import load_state, save_state
from ._types import Money, NotGiven, TimeoutTypes
from ._version import __version__

__all__ = ["BaseClient", "Call", "ChatMessageParam"]

ChatMessageParam = Mapping[str, Any] | ChatMessage
_T = TypeVar("_T")
_M = TypeVar("_M", bound=pydantic.BaseModel)


@dataclass(frozen=True)
class Call:
    """A request ready to send: its body (identical on every retry) and its reservation."""

    rid: str
    body: dict[str, Any]
    settlement: Settlement


class BaseClient:
    """Configuration and non-I/O logic shared by `AuctionClient` and `AsyncAuctionClient`."""

    def __init__(
        self,
        *,
        base_url: str | httpx.URL | None,
        api_key: str | None,
        budget: Budget,
        timeout: TimeoutTypes | NotGiven,
        max_retries: int,
        state_file: str | os.PathLike[str] | None,
        sync_on_start: bool,
        default_headers: Mapping[str, str] | None,
        clock: Callable[[], float],
        client_timeout: TimeoutTypes,
    ) -> None:
        base_url = base_url or os.environ.get(BASE_URL_ENV)
        if not base_url:
            raise ConfigurationError(f"pass base_url= or set {BASE_URL_ENV}")
        api_key = api_key or os.environ.get(API_KEY_ENV)
        if not api_key:
            raise ConfigurationError(f"pass api_key= or set {API_KEY_ENV}")
        if max_retries < 0:
            raise ConfigurationError("max_retries must not be negative")
        # A trailing slash makes relative joins keep any path prefix of the base URL.
        url = httpx.URL(str(base_url))
        self._base_url = url if url.raw_path.endswith(b"/") else httpx.URL(f"{url}/")
        self._api_key = api_key
        self._timeout: TimeoutTypes = client_timeout if isinstance(timeout, NotGiven) else timeout
        self._max_retries = max_retries
        self._default_headers = dict(default_headers or {})
        self._sync_on_start = sync_on_start
        self._synced = False
        self._state_path = None if state_file is None else Path(state_file)
        self._state_lock = threading.Lock()
        self._state_written = -1
        state = None if self._state_path is None else load_state(self._state_path)
        if state is None:
            self._bidder = PacingBidder(budget, clock=clock)
        else:
            self._bidder = PacingBidder.from_state(budget, state, clock=clock)

    @property
    def base_url(self) -> httpx.URL:
        """The server's base URL."""
        return self._base_url

    @property
    def bidder(self) -> PacingBidder:
        """The pacing state: `alpha`, `mu`, spend and what remains of the budget."""
        return self._bidder

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

    # -- requests ----------------------------------------------------------------------------

    def _url(self, path: str) -> httpx.URL:
        return self._base_url.join(path.lstrip("/"))

    def _headers(self, *, stream: bool = False) -> dict[str, str]:
        return {
            "Accept": "text/event-stream" if stream else "application/json",
            "User-Agent": f"inference-auctions-sdk/{__version__}",
            **self._default_headers,
            "Authorization": f"Bearer {self._api_key}",
        }

    def _timeout_for(self, timeout: TimeoutTypes | NotGiven) -> TimeoutTypes:
        return self._timeout if isinstance(timeout, NotGiven) else timeout

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
        if isinstance(exc, httpx.TimeoutException):
            return APITimeoutError(request, may_have_been_processed=may_have_been_processed)
        return APIConnectionError(request, may_have_been_processed=may_have_been_processed)

    @staticmethod
    def _may_have_reached_server(exc: httpx.TransportError) -> bool:
        return not isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout | httpx.PoolTimeout)

    # -- bids and bodies ---------------------------------------------------------------------

    def _place(
        self, value: Money, max_bid: Money | None, rid: str | None
    ) -> tuple[str, int, Settlement]:
        """Turn a value into a guarded bid and reserve it."""
        values = [to_micros(value, name="value")]
        cap = None if max_bid is None else to_micros(max_bid, name="max_bid")
        (bid,) = self._bidder.bid(values, max_bid=cap)
        rid = rid or uuid.uuid4().hex
        settlement = Settlement(self._bidder, rid=rid, reserved=bid, on_change=self._save_state)
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
    ) -> Call:
        params = dict(sampling_params or {})
        params.update({k: v for k, v in sampling.items() if not isinstance(v, NotGiven)})
        rid, bid, settlement = self._place(value, max_bid, rid)
        body = {
            "text": prompt,
            "sampling_params": params,
            "rid": rid,
            "stream": stream,
            "bid": format_credits(bid),
        }
        return Call(rid=rid, body=body, settlement=settlement)

    def _chat_call(
        self,
        messages: Iterable[ChatMessageParam],
        *,
        value: Money,
        stream: bool,
        options: Mapping[str, object | NotGiven],
        extra_body: Mapping[str, Any] | None,
        max_bid: Money | None,
        rid: str | None,
    ) -> Call:
        wire = [
            m.model_dump(exclude_none=True) if isinstance(m, ChatMessage) else dict(m)
            for m in messages
        ]
        rid, bid, settlement = self._place(value, max_bid, rid)
        body: dict[str, Any] = dict(extra_body or {})
        body.update({k: v for k, v in options.items() if not isinstance(v, NotGiven)})
        body.update(messages=wire, stream=stream, rid=rid, bid=format_credits(bid))
        return Call(rid=rid, body=body, settlement=settlement)

    @staticmethod
    def _complete(call: Call, response: httpx.Response, parse: Callable[[object, Call], _T]) -> _T:
        """Parse a read 2xx response, settling the bid even when the body is unusable."""
        try:
            return _validated(response, lambda payload: parse(payload, call))
        except BaseException as exc:
            # The server accepted the request, so it may well have charged it.
            call.settlement.fail(exc)
            raise

    @staticmethod
    def _parse(response: httpx.Response, model: type[_M]) -> _M:
        """A read 2xx response as `model`."""
        return _validated(response, model.model_validate)

    @staticmethod
    def _generation(payload: object, call: Call) -> Generation:
        """Parse a `/generate` body and settle the bid with its charge."""
        raw = GenerateResponse.model_validate(payload)
        meta = raw.meta_info
        if meta.auction is None:
            raise ValueError("the response has no auction object")
        call.settlement.charged(meta.auction)
        return Generation(
            rid=meta.id or call.rid,
            text=raw.text,
            output_ids=raw.output_ids,
            finish_reason=meta.finish_reason,
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

    # -- ledger sync and the state file ------------------------------------------------------

    def _sync_uses_balance(self) -> bool:
        """Calendar-period budgets can take their spend from the balance in one request."""
        return isinstance(self._bidder.budget.period, str)

    def _apply_balance(self, balance: Balance) -> bool:
        """Sync from the balance alone when the server's period is the budget's period."""
        period = self._bidder.budget.period
        if isinstance(period, str) and balance.period == period:
            self._bidder.sync(balance.spent_this_period_micros, period_start=balance.period_start)
            self._save_state()
            return True
        return False

    def _apply_entries(self, entries: Iterable[LedgerEntry]) -> None:
        """Sync from ledger rows since the start of the horizon or period."""
        spent = 0
        batches: dict[str, int] = {}
        for entry in entries:
            # Signs differ between ledgers that book debits as negative and those that do
            # not; the kind says which way the money went.
            if entry.kind == "charge":
                amount = abs(entry.amount_micros)
            elif entry.kind == "refund":
                amount = -abs(entry.amount_micros)
            else:
                continue
            spent += amount
            if entry.batch_id is not None:
                batches[entry.batch_id] = batches.get(entry.batch_id, 0) + amount
        self._bidder.sync(max(0, spent), batches=batches)
        self._save_state()

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
