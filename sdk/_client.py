"""The synchronous and asynchronous clients: only the I/O paths are written twice."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from types import TracebackType
from typing import Any, Literal, TypeVar, overload

import anyio
import httpx
import pydantic

from ._base_client import (
    BaseClient,
    Call,
    ChatMessageParam,
    OnBudgetExhausted,
    RawResponse,
    RequestOptions,
)
from ._budget import Budget
from ._constants import DEFAULT_MAX_RETRIES, DEFAULT_SYNC_INTERVAL, DEFAULT_TIMEOUT
from ._exceptions import APIError, ConfigurationError, NotFoundError, make_status_error
from ._ledger import AsyncLedger, AsyncMarket, AsyncModels, Ledger, Market, Models
from ._logs import logger
from ._models import (
    AuctionOutlook,
    BudgetPeriod,
    ChatCompletion,
    Completion,
    Generation,
    MarketPool,
    MarketRule,
    PriceFloor,
    Spend,
)
from ._streaming import (
    AsyncChatCompletionStream,
    AsyncStream,
    ChatCompletionStream,
    ChatParser,
    CompletionParser,
    GenerateParser,
    Stream,
    StreamCore,
)
from ._types import NOT_GIVEN, Money, NotGiven, TimeoutTypes

__all__ = ["AsyncAuctionClient", "AuctionClient"]

_M = TypeVar("_M", bound=pydantic.BaseModel)
_NO_OPTIONS = RequestOptions()
_OPTION_NAMES = ("extra_headers", "extra_query", "extra_body", "max_retries", "timeout")


def _split_options(kwargs: dict[str, Any]) -> tuple[RequestOptions, dict[str, Any]]:
    """The per-call options among `kwargs` (`service_tier` joins the body), and the rest."""
    options = {k: kwargs.pop(k) for k in _OPTION_NAMES if k in kwargs}
    options["extra_body"] = _with_tier(options.get("extra_body"), kwargs.pop("service_tier", None))
    return RequestOptions(**options), kwargs


def _with_tier(
    extra_body: Mapping[str, Any] | None, service_tier: str | None
) -> Mapping[str, Any] | None:
    """The body's extra fields with OpenAI's `service_tier` (None: not sent)."""
    if service_tier is None:
        return extra_body
    return {**(extra_body or {}), "service_tier": service_tier}


def _options(
    extra_headers: Mapping[str, str] | None,
    extra_query: Mapping[str, str | int] | None,
    extra_body: Mapping[str, Any] | None,
    service_tier: str | None,
    max_retries: int | NotGiven,
    timeout: TimeoutTypes | NotGiven,
) -> RequestOptions:
    """A public call's options, its `service_tier` in the body."""
    body = _with_tier(extra_body, service_tier)
    return RequestOptions(extra_headers, extra_query, body, max_retries, timeout)


def _generate_args(kwargs: dict[str, Any]) -> dict[str, Any]:
    """`generate`'s keyword arguments as `_generate` takes them."""
    sampling = {
        k: kwargs.pop(k) for k in ("max_new_tokens", "temperature", "top_p", "stop") if k in kwargs
    }
    return {
        "value": kwargs.pop("value"),
        "stream": kwargs.pop("stream", False),
        "sampling": sampling,
        "sampling_params": kwargs.pop("sampling_params", None),
        "max_bid": kwargs.pop("max_bid", None),
        "rid": kwargs.pop("rid", None),
        **_no_more(kwargs),
    }


def _openai_args(kwargs: dict[str, Any]) -> dict[str, Any]:
    """`chat`'s or `completions.create`'s keyword arguments as the internal calls take them."""
    fields = {
        k: kwargs.pop(k)
        for k in ("model", "max_tokens", "temperature", "top_p", "stop")
        if k in kwargs
    }
    return {
        "value": kwargs.pop("value"),
        "stream": kwargs.pop("stream", False),
        "fields": fields,
        "max_bid": kwargs.pop("max_bid", None),
        "rid": kwargs.pop("rid", None),
        **_no_more(kwargs),
    }


def _no_more(kwargs: dict[str, Any]) -> dict[str, Any]:
    if kwargs:
        raise TypeError(f"unexpected keyword arguments: {', '.join(sorted(kwargs))}")
    return {}


class AuctionClient(BaseClient):
    """A synchronous client that bids for you under a budget; safe to share between threads.

    **Parameters:**

    * **base_url** - the server, e.g. "http://127.0.0.1:8000"; else `INFERENCE_AUCTION_BASE_URL`.
    * **api_key** - sent as a bearer token; else `INFERENCE_AUCTION_API_KEY`.
    * **budget** - None (the default) paces against your budget period on the server; a
      `Budget(total=..., auctions=... or period=...)` is a plan of your own, shared through the
      server by every process that passes the same `start`.
    * **timeout** - per request; defaults to 600 s with 5 s to connect.
    * **max_retries** - retries of connection errors, 408, 409, 429 and 5xx.
    * **state_file** - a JSON file that keeps the learned multiplier across restarts.
    * **sync_on_start** - take the spend so far from the ledger before the first bid.
    * **sync_interval** - re-read the ledger-wide spend at least this often (seconds).
    * **on_budget_exhausted** - "raise" `BudgetExhaustedError`, or "bid_zero" (send at bid 0
      with a `BudgetExhaustedWarning`) once the budget of the period is spent.
    * **default_headers** - extra headers on every request.
    * **http_client** / **transport** - an `httpx.Client` to use, or a transport for a new one.
    * **clock** - the wall clock (`time.time`) that periodic budgets follow.
    """

    def __init__(
        self,
        base_url: str | httpx.URL | None = None,
        api_key: str | None = None,
        *,
        budget: Budget | None = None,
        timeout: TimeoutTypes | NotGiven = NOT_GIVEN,
        max_retries: int = DEFAULT_MAX_RETRIES,
        state_file: str | os.PathLike[str] | None = None,
        sync_on_start: bool = True,
        sync_interval: float | None = DEFAULT_SYNC_INTERVAL,
        on_budget_exhausted: OnBudgetExhausted = "raise",
        default_headers: Mapping[str, str] | None = None,
        http_client: httpx.Client | None = None,
        transport: httpx.BaseTransport | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if http_client is not None and transport is not None:
            raise ConfigurationError("pass http_client= or transport=, not both")
        super().__init__(
            base_url=base_url,
            api_key=api_key,
            budget=budget,
            timeout=timeout,
            max_retries=max_retries,
            state_file=state_file,
            sync_on_start=sync_on_start,
            sync_interval=sync_interval,
            on_budget_exhausted=on_budget_exhausted,
            default_headers=default_headers,
            clock=clock,
            client_timeout=DEFAULT_TIMEOUT if http_client is None else http_client.timeout,
        )
        self._owns_http = http_client is None
        self._http = http_client or httpx.Client(transport=transport, timeout=self._timeout)
        self._sync_lock = threading.Lock()
        self._bind_resources()

    def _bind_resources(self) -> None:
        self.ledger = Ledger(self)
        """Balance, entries, summaries, the budget period and spend of the account."""
        self.models = Models(self)
        """The models the server serves."""
        self.market = Market(self)
        """What places in the queue have recently cost."""
        self.completions = Completions(self)
        """OpenAI-style text completions with a bid."""
        self.chat = Chat(self)
        """`client.chat(...)`, and OpenAI's `client.chat.completions.create(...)`."""

    @property
    def is_closed(self) -> bool:
        """Whether `close()` was called (or the passed-in HTTP client was closed)."""
        return self._http.is_closed

    def close(self) -> None:
        """Close the connection pool (unless it was passed in)."""
        if self._owns_http:
            self._http.close()

    def __enter__(self) -> AuctionClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def with_options(
        self,
        *,
        timeout: TimeoutTypes | NotGiven = NOT_GIVEN,
        max_retries: int | NotGiven = NOT_GIVEN,
        default_headers: Mapping[str, str] | None = None,
        on_budget_exhausted: OnBudgetExhausted | NotGiven = NOT_GIVEN,
    ) -> AuctionClient:
        """A copy with other defaults that shares this client's connections and budget."""
        clone: AuctionClient = self._copy_with(
            timeout=timeout,
            max_retries=max_retries,
            default_headers=default_headers,
            on_budget_exhausted=on_budget_exhausted,
        )
        return clone

    @property
    def with_raw_response(self) -> RawResponses:
        """The same calls, returning a `RawResponse` (status, headers, request id, `.parse()`)."""
        return RawResponses(self)

    def sync(self) -> None:
        """Read the user's ledger-wide spend now (done before the first bid, then every
        `sync_interval` seconds): the budget period on the server, or spend since the plan
        start; and the price floor (`price_floor`)."""
        marker = self._bidder.sync_marker()
        path, params = self._sync_request()
        model: type[BudgetPeriod] | type[Spend] = BudgetPeriod if self._server_period else Spend
        payload = self._get(path, params, model)
        self._apply_sync(marker, payload)
        try:
            floor = self._read_floor()
        except APIError as exc:
            self._floor_failed(exc)
        else:
            self._floor.update(floor)

    def auction_outlook(self, value: Money, *, max_bid: Money | None = None) -> AuctionOutlook:
        """Where a request worth `value` would stand if sent now: the bid the pacing would
        send, whether it clears the price floor, the entrants ahead and the expected wait.

        Nothing is sent or reserved. On a server without the pool figures (or without a
        floor) the answer holds what is known: the bid and the floor.
        """
        self._ensure_synced()
        value_micros, bid = self._outlook_bid(value, max_bid)
        try:
            pool = self._get("/v1/market/pool", {"bid": bid}, MarketPool)
        except NotFoundError:
            return self._outlook(value_micros, bid, None, self._read_floor())
        return self._outlook(value_micros, bid, pool, None)

    def _read_floor(self) -> PriceFloor:
        try:
            return self._get("/v1/market/rule", {}, MarketRule).price_floor
        except NotFoundError:
            return PriceFloor()  # a server from before the rule was published: no floor

    @overload
    def generate(
        self,
        prompt: str,
        *,
        value: Money,
        stream: Literal[False] = False,
        max_new_tokens: int | NotGiven = NOT_GIVEN,
        temperature: float | NotGiven = NOT_GIVEN,
        top_p: float | NotGiven = NOT_GIVEN,
        stop: str | list[str] | NotGiven = NOT_GIVEN,
        sampling_params: Mapping[str, Any] | None = None,
        max_bid: Money | None = None,
        rid: str | None = None,
        service_tier: str | None = None,
        extra_headers: Mapping[str, str] | None = None,
        extra_query: Mapping[str, str | int] | None = None,
        extra_body: Mapping[str, Any] | None = None,
        max_retries: int | NotGiven = NOT_GIVEN,
        timeout: TimeoutTypes | NotGiven = NOT_GIVEN,
    ) -> Generation: ...

    @overload
    def generate(
        self,
        prompt: str,
        *,
        value: Money,
        stream: Literal[True],
        max_new_tokens: int | NotGiven = NOT_GIVEN,
        temperature: float | NotGiven = NOT_GIVEN,
        top_p: float | NotGiven = NOT_GIVEN,
        stop: str | list[str] | NotGiven = NOT_GIVEN,
        sampling_params: Mapping[str, Any] | None = None,
        max_bid: Money | None = None,
        rid: str | None = None,
        service_tier: str | None = None,
        extra_headers: Mapping[str, str] | None = None,
        extra_query: Mapping[str, str | int] | None = None,
        extra_body: Mapping[str, Any] | None = None,
        max_retries: int | NotGiven = NOT_GIVEN,
        timeout: TimeoutTypes | NotGiven = NOT_GIVEN,
    ) -> Stream[Generation]: ...

    @overload
    def generate(
        self,
        prompt: str,
        *,
        value: Money,
        stream: bool,
        max_new_tokens: int | NotGiven = NOT_GIVEN,
        temperature: float | NotGiven = NOT_GIVEN,
        top_p: float | NotGiven = NOT_GIVEN,
        stop: str | list[str] | NotGiven = NOT_GIVEN,
        sampling_params: Mapping[str, Any] | None = None,
        max_bid: Money | None = None,
        rid: str | None = None,
        service_tier: str | None = None,
        extra_headers: Mapping[str, str] | None = None,
        extra_query: Mapping[str, str | int] | None = None,
        extra_body: Mapping[str, Any] | None = None,
        max_retries: int | NotGiven = NOT_GIVEN,
        timeout: TimeoutTypes | NotGiven = NOT_GIVEN,
    ) -> Generation | Stream[Generation]: ...

    def generate(
        self,
        prompt: str,
        *,
        value: Money,
        stream: bool = False,
        max_new_tokens: int | NotGiven = NOT_GIVEN,
        temperature: float | NotGiven = NOT_GIVEN,
        top_p: float | NotGiven = NOT_GIVEN,
        stop: str | list[str] | NotGiven = NOT_GIVEN,
        sampling_params: Mapping[str, Any] | None = None,
        max_bid: Money | None = None,
        rid: str | None = None,
        service_tier: str | None = None,
        extra_headers: Mapping[str, str] | None = None,
        extra_query: Mapping[str, str | int] | None = None,
        extra_body: Mapping[str, Any] | None = None,
        max_retries: int | NotGiven = NOT_GIVEN,
        timeout: TimeoutTypes | NotGiven = NOT_GIVEN,
    ) -> Generation | Stream[Generation]:
        """Generate text for `prompt`, bidding for priority worth `value` credits to you."""
        result, _ = self._generate(
            prompt,
            value=value,
            stream=stream,
            sampling={
                "max_new_tokens": max_new_tokens,
                "temperature": temperature,
                "top_p": top_p,
                "stop": stop,
            },
            sampling_params=sampling_params,
            max_bid=max_bid,
            rid=rid,
            options=_options(
                extra_headers, extra_query, extra_body, service_tier, max_retries, timeout
            ),
        )
        return result

    # -- requests ----------------------------------------------------------------------------

    def _generate(
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
    ) -> tuple[Generation | Stream[Generation], httpx.Response]:
        self._ensure_synced()
        call = self._generate_call(
            prompt,
            value=value,
            stream=stream,
            sampling=sampling,
            sampling_params=sampling_params,
            max_bid=max_bid,
            rid=rid,
            options=options,
        )
        response = self._post(call, "/generate", stream=stream, options=options)
        if stream:
            parser = GenerateParser(call.rid)
            return Stream(response, StreamCore(parser, call.settlement, response)), response
        return self._complete(call, response, self._generation), response

    def _chat(
        self,
        messages: Iterable[ChatMessageParam],
        *,
        value: Money,
        stream: bool,
        fields: Mapping[str, object | NotGiven],
        max_bid: Money | None,
        rid: str | None,
        options: RequestOptions,
    ) -> tuple[ChatCompletion | Stream[ChatCompletion], httpx.Response]:
        self._ensure_synced()
        call = self._openai_call(
            {**fields, "messages": self._chat_messages(messages)},
            value=value,
            stream=stream,
            max_bid=max_bid,
            rid=rid,
            options=options,
        )
        response = self._post(call, "/v1/chat/completions", stream=stream, options=options)
        if stream:
            parser = ChatParser(call.rid)
            return Stream(response, StreamCore(parser, call.settlement, response)), response
        return self._complete(call, response, self._chat_completion), response

    def _completion(
        self,
        prompt: str,
        *,
        value: Money,
        stream: bool,
        fields: Mapping[str, object | NotGiven],
        max_bid: Money | None,
        rid: str | None,
        options: RequestOptions,
    ) -> tuple[Completion | Stream[Completion], httpx.Response]:
        self._ensure_synced()
        call = self._openai_call(
            {**fields, "prompt": prompt},
            value=value,
            stream=stream,
            max_bid=max_bid,
            rid=rid,
            options=options,
        )
        response = self._post(call, "/v1/completions", stream=stream, options=options)
        if stream:
            parser = CompletionParser(call.rid)
            return Stream(response, StreamCore(parser, call.settlement, response)), response
        return self._complete(call, response, self._text_completion), response

    # -- I/O ---------------------------------------------------------------------------------

    def _ensure_synced(self) -> None:
        self._check_open(self.is_closed)
        if not self._sync_due(time.monotonic()):
            return
        if self._synced:
            # A periodic refresh: one caller does it, the others bid on the figures they have.
            if self._sync_lock.locked():
                return
            with self._sync_lock:
                if self._sync_due(time.monotonic()):
                    try:
                        self.sync()
                    except (APIError, pydantic.ValidationError) as exc:
                        self._sync_failed(exc)
            return
        with self._sync_lock:
            if not self._synced:
                self.sync()

    def _post(
        self, call: Call, path: str, *, stream: bool, options: RequestOptions
    ) -> httpx.Response:
        try:
            response = self._send("POST", path, json=call.body, stream=stream, options=options)
            if not stream:
                response.read()
            return response
        except BaseException as exc:
            call.settlement.fail(exc)
            raise

    def _get(self, path: str, params: Mapping[str, str | int], model: type[_M]) -> _M:
        response = self._send("GET", path, params=params)
        response.read()
        return self._parse(response, model)

    def _send(
        self,
        method: str,
        path: str,
        *,
        json: Mapping[str, Any] | None = None,
        params: Mapping[str, str | int] | None = None,
        stream: bool = False,
        options: RequestOptions = _NO_OPTIONS,
    ) -> httpx.Response:
        """Send with retries; the body, and so the rid, is the same on every attempt."""
        self._check_open(self.is_closed)
        retries = self._retries_for(options)
        query = {**(params or {}), **(options.extra_query or {})}
        reached = False
        attempt = 0
        while True:
            request = self._http.build_request(
                method,
                self._url(path),
                json=json,
                params=query or None,
                headers=self._headers(stream=stream, extra=options.extra_headers),
                timeout=self._timeout_for(options.timeout),
            )
            logger.debug("HTTP request: %s %s", method, request.url)
            try:
                response = self._http.send(request, stream=stream)
            except httpx.TransportError as exc:
                reached = reached or self._may_have_reached_server(exc)
                if attempt >= retries:
                    raise self._connection_error(exc, request, reached) from exc
                delay = self._retry_delay(attempt, None)
                self._log_retry(method, request.url, delay, attempt, retries, type(exc).__name__)
                time.sleep(delay)
                attempt += 1
                continue
            logger.debug(
                "HTTP response: %s %s %d (request id %s)",
                method,
                request.url,
                response.status_code,
                response.headers.get("x-request-id"),
            )
            if response.is_success:
                return response
            response.read()
            response.close()
            if attempt >= retries or not self._should_retry(response):
                raise make_status_error(response)
            delay = self._retry_delay(attempt, response)
            self._log_retry(
                method, request.url, delay, attempt, retries, f"HTTP {response.status_code}"
            )
            time.sleep(delay)
            attempt += 1


class Chat:
    """`client.chat(...)`: a chat completion with a bid; `client.chat.completions.create(...)`
    is the same request in OpenAI's shape."""

    def __init__(self, client: AuctionClient) -> None:
        self._client = client
        self.completions = ChatCompletions(client)
        """OpenAI's `chat.completions.create`, with a bid."""

    @overload
    def __call__(
        self,
        messages: Iterable[ChatMessageParam],
        *,
        value: Money,
        stream: Literal[False] = False,
        model: str | NotGiven = NOT_GIVEN,
        max_tokens: int | NotGiven = NOT_GIVEN,
        temperature: float | NotGiven = NOT_GIVEN,
        top_p: float | NotGiven = NOT_GIVEN,
        stop: str | list[str] | NotGiven = NOT_GIVEN,
        max_bid: Money | None = None,
        rid: str | None = None,
        service_tier: str | None = None,
        extra_headers: Mapping[str, str] | None = None,
        extra_query: Mapping[str, str | int] | None = None,
        extra_body: Mapping[str, Any] | None = None,
        max_retries: int | NotGiven = NOT_GIVEN,
        timeout: TimeoutTypes | NotGiven = NOT_GIVEN,
    ) -> ChatCompletion: ...

    @overload
    def __call__(
        self,
        messages: Iterable[ChatMessageParam],
        *,
        value: Money,
        stream: Literal[True],
        model: str | NotGiven = NOT_GIVEN,
        max_tokens: int | NotGiven = NOT_GIVEN,
        temperature: float | NotGiven = NOT_GIVEN,
        top_p: float | NotGiven = NOT_GIVEN,
        stop: str | list[str] | NotGiven = NOT_GIVEN,
        max_bid: Money | None = None,
        rid: str | None = None,
        service_tier: str | None = None,
        extra_headers: Mapping[str, str] | None = None,
        extra_query: Mapping[str, str | int] | None = None,
        extra_body: Mapping[str, Any] | None = None,
        max_retries: int | NotGiven = NOT_GIVEN,
        timeout: TimeoutTypes | NotGiven = NOT_GIVEN,
    ) -> Stream[ChatCompletion]: ...

    @overload
    def __call__(
        self,
        messages: Iterable[ChatMessageParam],
        *,
        value: Money,
        stream: bool,
        model: str | NotGiven = NOT_GIVEN,
        max_tokens: int | NotGiven = NOT_GIVEN,
        temperature: float | NotGiven = NOT_GIVEN,
        top_p: float | NotGiven = NOT_GIVEN,
        stop: str | list[str] | NotGiven = NOT_GIVEN,
        max_bid: Money | None = None,
        rid: str | None = None,
        service_tier: str | None = None,
        extra_headers: Mapping[str, str] | None = None,
        extra_query: Mapping[str, str | int] | None = None,
        extra_body: Mapping[str, Any] | None = None,
        max_retries: int | NotGiven = NOT_GIVEN,
        timeout: TimeoutTypes | NotGiven = NOT_GIVEN,
    ) -> ChatCompletion | Stream[ChatCompletion]: ...

    def __call__(
        self,
        messages: Iterable[ChatMessageParam],
        *,
        value: Money,
        stream: bool = False,
        model: str | NotGiven = NOT_GIVEN,
        max_tokens: int | NotGiven = NOT_GIVEN,
        temperature: float | NotGiven = NOT_GIVEN,
        top_p: float | NotGiven = NOT_GIVEN,
        stop: str | list[str] | NotGiven = NOT_GIVEN,
        max_bid: Money | None = None,
        rid: str | None = None,
        service_tier: str | None = None,
        extra_headers: Mapping[str, str] | None = None,
        extra_query: Mapping[str, str | int] | None = None,
        extra_body: Mapping[str, Any] | None = None,
        max_retries: int | NotGiven = NOT_GIVEN,
        timeout: TimeoutTypes | NotGiven = NOT_GIVEN,
    ) -> ChatCompletion | Stream[ChatCompletion]:
        """An OpenAI-style chat completion, bidding for priority worth `value` credits."""
        result, _ = self._client._chat(
            messages,
            value=value,
            stream=stream,
            fields={
                "model": model,
                "max_tokens": max_tokens,
                "temperature": temperature,
                "top_p": top_p,
                "stop": stop,
            },
            max_bid=max_bid,
            rid=rid,
            options=_options(
                extra_headers, extra_query, extra_body, service_tier, max_retries, timeout
            ),
        )
        return result


class ChatCompletions:
    """`client.chat.completions.create(...)`: where an OpenAI user looks for it. Without
    `value`, the request bids 0 (it goes after those who bid in its batch, and pays nothing
    but the request fee); streamed, it yields typed `ChatCompletionChunk`s."""

    def __init__(self, client: AuctionClient) -> None:
        self._client = client

    @overload
    def create(
        self,
        *,
        messages: Iterable[ChatMessageParam],
        value: Money = 0,
        stream: Literal[False] = False,
        model: str | NotGiven = NOT_GIVEN,
        max_tokens: int | NotGiven = NOT_GIVEN,
        temperature: float | NotGiven = NOT_GIVEN,
        top_p: float | NotGiven = NOT_GIVEN,
        stop: str | list[str] | NotGiven = NOT_GIVEN,
        max_bid: Money | None = None,
        rid: str | None = None,
        service_tier: str | None = None,
        extra_headers: Mapping[str, str] | None = None,
        extra_query: Mapping[str, str | int] | None = None,
        extra_body: Mapping[str, Any] | None = None,
        max_retries: int | NotGiven = NOT_GIVEN,
        timeout: TimeoutTypes | NotGiven = NOT_GIVEN,
    ) -> ChatCompletion: ...

    @overload
    def create(
        self,
        *,
        messages: Iterable[ChatMessageParam],
        value: Money = 0,
        stream: Literal[True],
        model: str | NotGiven = NOT_GIVEN,
        max_tokens: int | NotGiven = NOT_GIVEN,
        temperature: float | NotGiven = NOT_GIVEN,
        top_p: float | NotGiven = NOT_GIVEN,
        stop: str | list[str] | NotGiven = NOT_GIVEN,
        max_bid: Money | None = None,
        rid: str | None = None,
        service_tier: str | None = None,
        extra_headers: Mapping[str, str] | None = None,
        extra_query: Mapping[str, str | int] | None = None,
        extra_body: Mapping[str, Any] | None = None,
        max_retries: int | NotGiven = NOT_GIVEN,
        timeout: TimeoutTypes | NotGiven = NOT_GIVEN,
    ) -> ChatCompletionStream: ...

    @overload
    def create(
        self,
        *,
        messages: Iterable[ChatMessageParam],
        value: Money = 0,
        stream: bool,
        model: str | NotGiven = NOT_GIVEN,
        max_tokens: int | NotGiven = NOT_GIVEN,
        temperature: float | NotGiven = NOT_GIVEN,
        top_p: float | NotGiven = NOT_GIVEN,
        stop: str | list[str] | NotGiven = NOT_GIVEN,
        max_bid: Money | None = None,
        rid: str | None = None,
        service_tier: str | None = None,
        extra_headers: Mapping[str, str] | None = None,
        extra_query: Mapping[str, str | int] | None = None,
        extra_body: Mapping[str, Any] | None = None,
        max_retries: int | NotGiven = NOT_GIVEN,
        timeout: TimeoutTypes | NotGiven = NOT_GIVEN,
    ) -> ChatCompletion | ChatCompletionStream: ...

    def create(
        self,
        *,
        messages: Iterable[ChatMessageParam],
        value: Money = 0,
        stream: bool = False,
        model: str | NotGiven = NOT_GIVEN,
        max_tokens: int | NotGiven = NOT_GIVEN,
        temperature: float | NotGiven = NOT_GIVEN,
        top_p: float | NotGiven = NOT_GIVEN,
        stop: str | list[str] | NotGiven = NOT_GIVEN,
        max_bid: Money | None = None,
        rid: str | None = None,
        service_tier: str | None = None,
        extra_headers: Mapping[str, str] | None = None,
        extra_query: Mapping[str, str | int] | None = None,
        extra_body: Mapping[str, Any] | None = None,
        max_retries: int | NotGiven = NOT_GIVEN,
        timeout: TimeoutTypes | NotGiven = NOT_GIVEN,
    ) -> ChatCompletion | ChatCompletionStream:
        """A chat completion of `messages`, bidding for priority worth `value` credits."""
        result, _ = self._client._chat(
            messages,
            value=value,
            stream=stream,
            fields={
                "model": model,
                "max_tokens": max_tokens,
                "temperature": temperature,
                "top_p": top_p,
                "stop": stop,
            },
            max_bid=max_bid,
            rid=rid,
            options=_options(
                extra_headers, extra_query, extra_body, service_tier, max_retries, timeout
            ),
        )
        return ChatCompletionStream(result) if isinstance(result, Stream) else result


class Completions:
    """`POST /v1/completions` with a bid, as `client.completions.create(...)`."""

    def __init__(self, client: AuctionClient) -> None:
        self._client = client

    @overload
    def create(
        self,
        *,
        prompt: str,
        value: Money,
        stream: Literal[False] = False,
        model: str | NotGiven = NOT_GIVEN,
        max_tokens: int | NotGiven = NOT_GIVEN,
        temperature: float | NotGiven = NOT_GIVEN,
        top_p: float | NotGiven = NOT_GIVEN,
        stop: str | list[str] | NotGiven = NOT_GIVEN,
        max_bid: Money | None = None,
        rid: str | None = None,
        service_tier: str | None = None,
        extra_headers: Mapping[str, str] | None = None,
        extra_query: Mapping[str, str | int] | None = None,
        extra_body: Mapping[str, Any] | None = None,
        max_retries: int | NotGiven = NOT_GIVEN,
        timeout: TimeoutTypes | NotGiven = NOT_GIVEN,
    ) -> Completion: ...

    @overload
    def create(
        self,
        *,
        prompt: str,
        value: Money,
        stream: Literal[True],
        model: str | NotGiven = NOT_GIVEN,
        max_tokens: int | NotGiven = NOT_GIVEN,
        temperature: float | NotGiven = NOT_GIVEN,
        top_p: float | NotGiven = NOT_GIVEN,
        stop: str | list[str] | NotGiven = NOT_GIVEN,
        max_bid: Money | None = None,
        rid: str | None = None,
        service_tier: str | None = None,
        extra_headers: Mapping[str, str] | None = None,
        extra_query: Mapping[str, str | int] | None = None,
        extra_body: Mapping[str, Any] | None = None,
        max_retries: int | NotGiven = NOT_GIVEN,
        timeout: TimeoutTypes | NotGiven = NOT_GIVEN,
    ) -> Stream[Completion]: ...

    @overload
    def create(
        self,
        *,
        prompt: str,
        value: Money,
        stream: bool,
        model: str | NotGiven = NOT_GIVEN,
        max_tokens: int | NotGiven = NOT_GIVEN,
        temperature: float | NotGiven = NOT_GIVEN,
        top_p: float | NotGiven = NOT_GIVEN,
        stop: str | list[str] | NotGiven = NOT_GIVEN,
        max_bid: Money | None = None,
        rid: str | None = None,
        service_tier: str | None = None,
        extra_headers: Mapping[str, str] | None = None,
        extra_query: Mapping[str, str | int] | None = None,
        extra_body: Mapping[str, Any] | None = None,
        max_retries: int | NotGiven = NOT_GIVEN,
        timeout: TimeoutTypes | NotGiven = NOT_GIVEN,
    ) -> Completion | Stream[Completion]: ...

    def create(
        self,
        *,
        prompt: str,
        value: Money,
        stream: bool = False,
        model: str | NotGiven = NOT_GIVEN,
        max_tokens: int | NotGiven = NOT_GIVEN,
        temperature: float | NotGiven = NOT_GIVEN,
        top_p: float | NotGiven = NOT_GIVEN,
        stop: str | list[str] | NotGiven = NOT_GIVEN,
        max_bid: Money | None = None,
        rid: str | None = None,
        service_tier: str | None = None,
        extra_headers: Mapping[str, str] | None = None,
        extra_query: Mapping[str, str | int] | None = None,
        extra_body: Mapping[str, Any] | None = None,
        max_retries: int | NotGiven = NOT_GIVEN,
        timeout: TimeoutTypes | NotGiven = NOT_GIVEN,
    ) -> Completion | Stream[Completion]:
        """A text completion of `prompt`, bidding for priority worth `value` credits."""
        result, _ = self._client._completion(
            prompt,
            value=value,
            stream=stream,
            fields={
                "model": model,
                "max_tokens": max_tokens,
                "temperature": temperature,
                "top_p": top_p,
                "stop": stop,
            },
            max_bid=max_bid,
            rid=rid,
            options=_options(
                extra_headers, extra_query, extra_body, service_tier, max_retries, timeout
            ),
        )
        return result


class RawResponses:
    """`client.with_raw_response`: each call returns a `RawResponse` around its result."""

    def __init__(self, client: AuctionClient) -> None:
        self._client = client

    def generate(self, prompt: str, **kwargs: Any) -> RawResponse[Any]:
        """`generate` with the HTTP response."""
        client = self._client
        options, rest = _split_options(kwargs)
        result, response = client._generate(prompt, options=options, **_generate_args(rest))
        return RawResponse(response, result)

    def chat(self, messages: Iterable[ChatMessageParam], **kwargs: Any) -> RawResponse[Any]:
        """`chat` with the HTTP response."""
        options, rest = _split_options(kwargs)
        result, response = self._client._chat(messages, options=options, **_openai_args(rest))
        return RawResponse(response, result)

    def completions(self, *, prompt: str, **kwargs: Any) -> RawResponse[Any]:
        """`completions.create` with the HTTP response."""
        options, rest = _split_options(kwargs)
        result, response = self._client._completion(prompt, options=options, **_openai_args(rest))
        return RawResponse(response, result)


class AsyncAuctionClient(BaseClient):
    """An asynchronous client that bids for you under a budget; safe to share between tasks.

    Takes the same parameters as `AuctionClient`, with an `httpx.AsyncClient` or an async
    transport.
    """

    def __init__(
        self,
        base_url: str | httpx.URL | None = None,
        api_key: str | None = None,
        *,
        budget: Budget | None = None,
        timeout: TimeoutTypes | NotGiven = NOT_GIVEN,
        max_retries: int = DEFAULT_MAX_RETRIES,
        state_file: str | os.PathLike[str] | None = None,
        sync_on_start: bool = True,
        sync_interval: float | None = DEFAULT_SYNC_INTERVAL,
        on_budget_exhausted: OnBudgetExhausted = "raise",
        default_headers: Mapping[str, str] | None = None,
        http_client: httpx.AsyncClient | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if http_client is not None and transport is not None:
            raise ConfigurationError("pass http_client= or transport=, not both")
        super().__init__(
            base_url=base_url,
            api_key=api_key,
            budget=budget,
            timeout=timeout,
            max_retries=max_retries,
            state_file=state_file,
            sync_on_start=sync_on_start,
            sync_interval=sync_interval,
            on_budget_exhausted=on_budget_exhausted,
            default_headers=default_headers,
            clock=clock,
            client_timeout=DEFAULT_TIMEOUT if http_client is None else http_client.timeout,
        )
        self._owns_http = http_client is None
        self._http = http_client or httpx.AsyncClient(transport=transport, timeout=self._timeout)
        self._sync_lock = anyio.Lock()
        self._bind_resources()

    def _bind_resources(self) -> None:
        self.ledger = AsyncLedger(self)
        """Balance, entries, summaries, the budget period and spend of the account."""
        self.models = AsyncModels(self)
        """The models the server serves."""
        self.market = AsyncMarket(self)
        """What places in the queue have recently cost."""
        self.completions = AsyncCompletions(self)
        """OpenAI-style text completions with a bid."""
        self.chat = AsyncChat(self)
        """`await client.chat(...)`, and `await client.chat.completions.create(...)`."""

    @property
    def is_closed(self) -> bool:
        """Whether `close()` was called (or the passed-in HTTP client was closed)."""
        return self._http.is_closed

    async def close(self) -> None:
        """Close the connection pool (unless it was passed in)."""
        if self._owns_http:
            await self._http.aclose()

    async def __aenter__(self) -> AsyncAuctionClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    def with_options(
        self,
        *,
        timeout: TimeoutTypes | NotGiven = NOT_GIVEN,
        max_retries: int | NotGiven = NOT_GIVEN,
        default_headers: Mapping[str, str] | None = None,
        on_budget_exhausted: OnBudgetExhausted | NotGiven = NOT_GIVEN,
    ) -> AsyncAuctionClient:
        """A copy with other defaults that shares this client's connections and budget."""
        clone: AsyncAuctionClient = self._copy_with(
            timeout=timeout,
            max_retries=max_retries,
            default_headers=default_headers,
            on_budget_exhausted=on_budget_exhausted,
        )
        return clone

    @property
    def with_raw_response(self) -> AsyncRawResponses:
        """The same calls, returning a `RawResponse` (status, headers, request id, `.parse()`)."""
        return AsyncRawResponses(self)

    async def sync(self) -> None:
        """Read the user's ledger-wide spend now (done before the first bid, then every
        `sync_interval` seconds): the budget period on the server, or spend since the plan
        start; and the price floor (`price_floor`)."""
        marker = self._bidder.sync_marker()
        path, params = self._sync_request()
        model: type[BudgetPeriod] | type[Spend] = BudgetPeriod if self._server_period else Spend
        payload = await self._get(path, params, model)
        self._apply_sync(marker, payload)
        try:
            floor = await self._read_floor()
        except APIError as exc:
            self._floor_failed(exc)
        else:
            self._floor.update(floor)

    async def auction_outlook(
        self, value: Money, *, max_bid: Money | None = None
    ) -> AuctionOutlook:
        """Where a request worth `value` would stand if sent now: the bid the pacing would
        send, whether it clears the price floor, the entrants ahead and the expected wait.

        Nothing is sent or reserved. On a server without the pool figures (or without a
        floor) the answer holds what is known: the bid and the floor.
        """
        await self._ensure_synced()
        value_micros, bid = self._outlook_bid(value, max_bid)
        try:
            pool = await self._get("/v1/market/pool", {"bid": bid}, MarketPool)
        except NotFoundError:
            return self._outlook(value_micros, bid, None, await self._read_floor())
        return self._outlook(value_micros, bid, pool, None)

    async def _read_floor(self) -> PriceFloor:
        try:
            return (await self._get("/v1/market/rule", {}, MarketRule)).price_floor
        except NotFoundError:
            return PriceFloor()  # a server from before the rule was published: no floor

    @overload
    async def generate(
        self,
        prompt: str,
        *,
        value: Money,
        stream: Literal[False] = False,
        max_new_tokens: int | NotGiven = NOT_GIVEN,
        temperature: float | NotGiven = NOT_GIVEN,
        top_p: float | NotGiven = NOT_GIVEN,
        stop: str | list[str] | NotGiven = NOT_GIVEN,
        sampling_params: Mapping[str, Any] | None = None,
        max_bid: Money | None = None,
        rid: str | None = None,
        service_tier: str | None = None,
        extra_headers: Mapping[str, str] | None = None,
        extra_query: Mapping[str, str | int] | None = None,
        extra_body: Mapping[str, Any] | None = None,
        max_retries: int | NotGiven = NOT_GIVEN,
        timeout: TimeoutTypes | NotGiven = NOT_GIVEN,
    ) -> Generation: ...

    @overload
    async def generate(
        self,
        prompt: str,
        *,
        value: Money,
        stream: Literal[True],
        max_new_tokens: int | NotGiven = NOT_GIVEN,
        temperature: float | NotGiven = NOT_GIVEN,
        top_p: float | NotGiven = NOT_GIVEN,
        stop: str | list[str] | NotGiven = NOT_GIVEN,
        sampling_params: Mapping[str, Any] | None = None,
        max_bid: Money | None = None,
        rid: str | None = None,
        service_tier: str | None = None,
        extra_headers: Mapping[str, str] | None = None,
        extra_query: Mapping[str, str | int] | None = None,
        extra_body: Mapping[str, Any] | None = None,
        max_retries: int | NotGiven = NOT_GIVEN,
        timeout: TimeoutTypes | NotGiven = NOT_GIVEN,
    ) -> AsyncStream[Generation]: ...

    @overload
    async def generate(
        self,
        prompt: str,
        *,
        value: Money,
        stream: bool,
        max_new_tokens: int | NotGiven = NOT_GIVEN,
        temperature: float | NotGiven = NOT_GIVEN,
        top_p: float | NotGiven = NOT_GIVEN,
        stop: str | list[str] | NotGiven = NOT_GIVEN,
        sampling_params: Mapping[str, Any] | None = None,
        max_bid: Money | None = None,
        rid: str | None = None,
        service_tier: str | None = None,
        extra_headers: Mapping[str, str] | None = None,
        extra_query: Mapping[str, str | int] | None = None,
        extra_body: Mapping[str, Any] | None = None,
        max_retries: int | NotGiven = NOT_GIVEN,
        timeout: TimeoutTypes | NotGiven = NOT_GIVEN,
    ) -> Generation | AsyncStream[Generation]: ...

    async def generate(
        self,
        prompt: str,
        *,
        value: Money,
        stream: bool = False,
        max_new_tokens: int | NotGiven = NOT_GIVEN,
        temperature: float | NotGiven = NOT_GIVEN,
        top_p: float | NotGiven = NOT_GIVEN,
        stop: str | list[str] | NotGiven = NOT_GIVEN,
        sampling_params: Mapping[str, Any] | None = None,
        max_bid: Money | None = None,
        rid: str | None = None,
        service_tier: str | None = None,
        extra_headers: Mapping[str, str] | None = None,
        extra_query: Mapping[str, str | int] | None = None,
        extra_body: Mapping[str, Any] | None = None,
        max_retries: int | NotGiven = NOT_GIVEN,
        timeout: TimeoutTypes | NotGiven = NOT_GIVEN,
    ) -> Generation | AsyncStream[Generation]:
        """Generate text for `prompt`, bidding for priority worth `value` credits to you."""
        result, _ = await self._generate(
            prompt,
            value=value,
            stream=stream,
            sampling={
                "max_new_tokens": max_new_tokens,
                "temperature": temperature,
                "top_p": top_p,
                "stop": stop,
            },
            sampling_params=sampling_params,
            max_bid=max_bid,
            rid=rid,
            options=_options(
                extra_headers, extra_query, extra_body, service_tier, max_retries, timeout
            ),
        )
        return result

    # -- requests ----------------------------------------------------------------------------

    async def _generate(
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
    ) -> tuple[Generation | AsyncStream[Generation], httpx.Response]:
        await self._ensure_synced()
        call = self._generate_call(
            prompt,
            value=value,
            stream=stream,
            sampling=sampling,
            sampling_params=sampling_params,
            max_bid=max_bid,
            rid=rid,
            options=options,
        )
        response = await self._post(call, "/generate", stream=stream, options=options)
        if stream:
            parser = GenerateParser(call.rid)
            return AsyncStream(response, StreamCore(parser, call.settlement, response)), response
        return self._complete(call, response, self._generation), response

    async def _chat(
        self,
        messages: Iterable[ChatMessageParam],
        *,
        value: Money,
        stream: bool,
        fields: Mapping[str, object | NotGiven],
        max_bid: Money | None,
        rid: str | None,
        options: RequestOptions,
    ) -> tuple[ChatCompletion | AsyncStream[ChatCompletion], httpx.Response]:
        await self._ensure_synced()
        call = self._openai_call(
            {**fields, "messages": self._chat_messages(messages)},
            value=value,
            stream=stream,
            max_bid=max_bid,
            rid=rid,
            options=options,
        )
        response = await self._post(call, "/v1/chat/completions", stream=stream, options=options)
        if stream:
            parser = ChatParser(call.rid)
            return AsyncStream(response, StreamCore(parser, call.settlement, response)), response
        return self._complete(call, response, self._chat_completion), response

    async def _completion(
        self,
        prompt: str,
        *,
        value: Money,
        stream: bool,
        fields: Mapping[str, object | NotGiven],
        max_bid: Money | None,
        rid: str | None,
        options: RequestOptions,
    ) -> tuple[Completion | AsyncStream[Completion], httpx.Response]:
        await self._ensure_synced()
        call = self._openai_call(
            {**fields, "prompt": prompt},
            value=value,
            stream=stream,
            max_bid=max_bid,
            rid=rid,
            options=options,
        )
        response = await self._post(call, "/v1/completions", stream=stream, options=options)
        if stream:
            parser = CompletionParser(call.rid)
            return AsyncStream(response, StreamCore(parser, call.settlement, response)), response
        return self._complete(call, response, self._text_completion), response

    # -- I/O ---------------------------------------------------------------------------------

    async def _ensure_synced(self) -> None:
        self._check_open(self.is_closed)
        if not self._sync_due(time.monotonic()):
            return
        if self._synced:
            # A periodic refresh: one caller does it, the others bid on the figures they have.
            if self._sync_lock.locked():
                return
            async with self._sync_lock:
                if self._sync_due(time.monotonic()):
                    try:
                        await self.sync()
                    except (APIError, pydantic.ValidationError) as exc:
                        self._sync_failed(exc)
            return
        async with self._sync_lock:
            if not self._synced:
                await self.sync()

    async def _post(
        self, call: Call, path: str, *, stream: bool, options: RequestOptions
    ) -> httpx.Response:
        try:
            response = await self._send(
                "POST", path, json=call.body, stream=stream, options=options
            )
            if not stream:
                await response.aread()
            return response
        except BaseException as exc:
            call.settlement.fail(exc)
            raise

    async def _get(self, path: str, params: Mapping[str, str | int], model: type[_M]) -> _M:
        response = await self._send("GET", path, params=params)
        await response.aread()
        return self._parse(response, model)

    async def _send(
        self,
        method: str,
        path: str,
        *,
        json: Mapping[str, Any] | None = None,
        params: Mapping[str, str | int] | None = None,
        stream: bool = False,
        options: RequestOptions = _NO_OPTIONS,
    ) -> httpx.Response:
        """Send with retries; the body, and so the rid, is the same on every attempt."""
        self._check_open(self.is_closed)
        retries = self._retries_for(options)
        query = {**(params or {}), **(options.extra_query or {})}
        reached = False
        attempt = 0
        while True:
            request = self._http.build_request(
                method,
                self._url(path),
                json=json,
                params=query or None,
                headers=self._headers(stream=stream, extra=options.extra_headers),
                timeout=self._timeout_for(options.timeout),
            )
            logger.debug("HTTP request: %s %s", method, request.url)
            try:
                response = await self._http.send(request, stream=stream)
            except httpx.TransportError as exc:
                reached = reached or self._may_have_reached_server(exc)
                if attempt >= retries:
                    raise self._connection_error(exc, request, reached) from exc
                delay = self._retry_delay(attempt, None)
                self._log_retry(method, request.url, delay, attempt, retries, type(exc).__name__)
                await anyio.sleep(delay)
                attempt += 1
                continue
            logger.debug(
                "HTTP response: %s %s %d (request id %s)",
                method,
                request.url,
                response.status_code,
                response.headers.get("x-request-id"),
            )
            if response.is_success:
                return response
            await response.aread()
            await response.aclose()
            if attempt >= retries or not self._should_retry(response):
                raise make_status_error(response)
            delay = self._retry_delay(attempt, response)
            self._log_retry(
                method, request.url, delay, attempt, retries, f"HTTP {response.status_code}"
            )
            await anyio.sleep(delay)
            attempt += 1


class AsyncChat:
    """`client.chat(...)`: a chat completion with a bid; `client.chat.completions.create(...)`
    is the same request in OpenAI's shape."""

    def __init__(self, client: AsyncAuctionClient) -> None:
        self._client = client
        self.completions = AsyncChatCompletions(client)
        """OpenAI's `chat.completions.create`, with a bid."""

    @overload
    async def __call__(
        self,
        messages: Iterable[ChatMessageParam],
        *,
        value: Money,
        stream: Literal[False] = False,
        model: str | NotGiven = NOT_GIVEN,
        max_tokens: int | NotGiven = NOT_GIVEN,
        temperature: float | NotGiven = NOT_GIVEN,
        top_p: float | NotGiven = NOT_GIVEN,
        stop: str | list[str] | NotGiven = NOT_GIVEN,
        max_bid: Money | None = None,
        rid: str | None = None,
        service_tier: str | None = None,
        extra_headers: Mapping[str, str] | None = None,
        extra_query: Mapping[str, str | int] | None = None,
        extra_body: Mapping[str, Any] | None = None,
        max_retries: int | NotGiven = NOT_GIVEN,
        timeout: TimeoutTypes | NotGiven = NOT_GIVEN,
    ) -> ChatCompletion: ...

    @overload
    async def __call__(
        self,
        messages: Iterable[ChatMessageParam],
        *,
        value: Money,
        stream: Literal[True],
        model: str | NotGiven = NOT_GIVEN,
        max_tokens: int | NotGiven = NOT_GIVEN,
        temperature: float | NotGiven = NOT_GIVEN,
        top_p: float | NotGiven = NOT_GIVEN,
        stop: str | list[str] | NotGiven = NOT_GIVEN,
        max_bid: Money | None = None,
        rid: str | None = None,
        service_tier: str | None = None,
        extra_headers: Mapping[str, str] | None = None,
        extra_query: Mapping[str, str | int] | None = None,
        extra_body: Mapping[str, Any] | None = None,
        max_retries: int | NotGiven = NOT_GIVEN,
        timeout: TimeoutTypes | NotGiven = NOT_GIVEN,
    ) -> AsyncStream[ChatCompletion]: ...

    @overload
    async def __call__(
        self,
        messages: Iterable[ChatMessageParam],
        *,
        value: Money,
        stream: bool,
        model: str | NotGiven = NOT_GIVEN,
        max_tokens: int | NotGiven = NOT_GIVEN,
        temperature: float | NotGiven = NOT_GIVEN,
        top_p: float | NotGiven = NOT_GIVEN,
        stop: str | list[str] | NotGiven = NOT_GIVEN,
        max_bid: Money | None = None,
        rid: str | None = None,
        service_tier: str | None = None,
        extra_headers: Mapping[str, str] | None = None,
        extra_query: Mapping[str, str | int] | None = None,
        extra_body: Mapping[str, Any] | None = None,
        max_retries: int | NotGiven = NOT_GIVEN,
        timeout: TimeoutTypes | NotGiven = NOT_GIVEN,
    ) -> ChatCompletion | AsyncStream[ChatCompletion]: ...

    async def __call__(
        self,
        messages: Iterable[ChatMessageParam],
        *,
        value: Money,
        stream: bool = False,
        model: str | NotGiven = NOT_GIVEN,
        max_tokens: int | NotGiven = NOT_GIVEN,
        temperature: float | NotGiven = NOT_GIVEN,
        top_p: float | NotGiven = NOT_GIVEN,
        stop: str | list[str] | NotGiven = NOT_GIVEN,
        max_bid: Money | None = None,
        rid: str | None = None,
        service_tier: str | None = None,
        extra_headers: Mapping[str, str] | None = None,
        extra_query: Mapping[str, str | int] | None = None,
        extra_body: Mapping[str, Any] | None = None,
        max_retries: int | NotGiven = NOT_GIVEN,
        timeout: TimeoutTypes | NotGiven = NOT_GIVEN,
    ) -> ChatCompletion | AsyncStream[ChatCompletion]:
        """An OpenAI-style chat completion, bidding for priority worth `value` credits."""
        result, _ = await self._client._chat(
            messages,
            value=value,
            stream=stream,
            fields={
                "model": model,
                "max_tokens": max_tokens,
                "temperature": temperature,
                "top_p": top_p,
                "stop": stop,
            },
            max_bid=max_bid,
            rid=rid,
            options=_options(
                extra_headers, extra_query, extra_body, service_tier, max_retries, timeout
            ),
        )
        return result


class AsyncChatCompletions:
    """`client.chat.completions.create(...)`: where an OpenAI user looks for it. Without
    `value`, the request bids 0 (it goes after those who bid in its batch, and pays nothing
    but the request fee); streamed, it yields typed `ChatCompletionChunk`s."""

    def __init__(self, client: AsyncAuctionClient) -> None:
        self._client = client

    @overload
    async def create(
        self,
        *,
        messages: Iterable[ChatMessageParam],
        value: Money = 0,
        stream: Literal[False] = False,
        model: str | NotGiven = NOT_GIVEN,
        max_tokens: int | NotGiven = NOT_GIVEN,
        temperature: float | NotGiven = NOT_GIVEN,
        top_p: float | NotGiven = NOT_GIVEN,
        stop: str | list[str] | NotGiven = NOT_GIVEN,
        max_bid: Money | None = None,
        rid: str | None = None,
        service_tier: str | None = None,
        extra_headers: Mapping[str, str] | None = None,
        extra_query: Mapping[str, str | int] | None = None,
        extra_body: Mapping[str, Any] | None = None,
        max_retries: int | NotGiven = NOT_GIVEN,
        timeout: TimeoutTypes | NotGiven = NOT_GIVEN,
    ) -> ChatCompletion: ...

    @overload
    async def create(
        self,
        *,
        messages: Iterable[ChatMessageParam],
        value: Money = 0,
        stream: Literal[True],
        model: str | NotGiven = NOT_GIVEN,
        max_tokens: int | NotGiven = NOT_GIVEN,
        temperature: float | NotGiven = NOT_GIVEN,
        top_p: float | NotGiven = NOT_GIVEN,
        stop: str | list[str] | NotGiven = NOT_GIVEN,
        max_bid: Money | None = None,
        rid: str | None = None,
        service_tier: str | None = None,
        extra_headers: Mapping[str, str] | None = None,
        extra_query: Mapping[str, str | int] | None = None,
        extra_body: Mapping[str, Any] | None = None,
        max_retries: int | NotGiven = NOT_GIVEN,
        timeout: TimeoutTypes | NotGiven = NOT_GIVEN,
    ) -> AsyncChatCompletionStream: ...

    @overload
    async def create(
        self,
        *,
        messages: Iterable[ChatMessageParam],
        value: Money = 0,
        stream: bool,
        model: str | NotGiven = NOT_GIVEN,
        max_tokens: int | NotGiven = NOT_GIVEN,
        temperature: float | NotGiven = NOT_GIVEN,
        top_p: float | NotGiven = NOT_GIVEN,
        stop: str | list[str] | NotGiven = NOT_GIVEN,
        max_bid: Money | None = None,
        rid: str | None = None,
        service_tier: str | None = None,
        extra_headers: Mapping[str, str] | None = None,
        extra_query: Mapping[str, str | int] | None = None,
        extra_body: Mapping[str, Any] | None = None,
        max_retries: int | NotGiven = NOT_GIVEN,
        timeout: TimeoutTypes | NotGiven = NOT_GIVEN,
    ) -> ChatCompletion | AsyncChatCompletionStream: ...

    async def create(
        self,
        *,
        messages: Iterable[ChatMessageParam],
        value: Money = 0,
        stream: bool = False,
        model: str | NotGiven = NOT_GIVEN,
        max_tokens: int | NotGiven = NOT_GIVEN,
        temperature: float | NotGiven = NOT_GIVEN,
        top_p: float | NotGiven = NOT_GIVEN,
        stop: str | list[str] | NotGiven = NOT_GIVEN,
        max_bid: Money | None = None,
        rid: str | None = None,
        service_tier: str | None = None,
        extra_headers: Mapping[str, str] | None = None,
        extra_query: Mapping[str, str | int] | None = None,
        extra_body: Mapping[str, Any] | None = None,
        max_retries: int | NotGiven = NOT_GIVEN,
        timeout: TimeoutTypes | NotGiven = NOT_GIVEN,
    ) -> ChatCompletion | AsyncChatCompletionStream:
        """A chat completion of `messages`, bidding for priority worth `value` credits."""
        result, _ = await self._client._chat(
            messages,
            value=value,
            stream=stream,
            fields={
                "model": model,
                "max_tokens": max_tokens,
                "temperature": temperature,
                "top_p": top_p,
                "stop": stop,
            },
            max_bid=max_bid,
            rid=rid,
            options=_options(
                extra_headers, extra_query, extra_body, service_tier, max_retries, timeout
            ),
        )
        return AsyncChatCompletionStream(result) if isinstance(result, AsyncStream) else result


class AsyncCompletions:
    """`POST /v1/completions` with a bid, as `client.completions.create(...)`."""

    def __init__(self, client: AsyncAuctionClient) -> None:
        self._client = client

    @overload
    async def create(
        self,
        *,
        prompt: str,
        value: Money,
        stream: Literal[False] = False,
        model: str | NotGiven = NOT_GIVEN,
        max_tokens: int | NotGiven = NOT_GIVEN,
        temperature: float | NotGiven = NOT_GIVEN,
        top_p: float | NotGiven = NOT_GIVEN,
        stop: str | list[str] | NotGiven = NOT_GIVEN,
        max_bid: Money | None = None,
        rid: str | None = None,
        service_tier: str | None = None,
        extra_headers: Mapping[str, str] | None = None,
        extra_query: Mapping[str, str | int] | None = None,
        extra_body: Mapping[str, Any] | None = None,
        max_retries: int | NotGiven = NOT_GIVEN,
        timeout: TimeoutTypes | NotGiven = NOT_GIVEN,
    ) -> Completion: ...

    @overload
    async def create(
        self,
        *,
        prompt: str,
        value: Money,
        stream: Literal[True],
        model: str | NotGiven = NOT_GIVEN,
        max_tokens: int | NotGiven = NOT_GIVEN,
        temperature: float | NotGiven = NOT_GIVEN,
        top_p: float | NotGiven = NOT_GIVEN,
        stop: str | list[str] | NotGiven = NOT_GIVEN,
        max_bid: Money | None = None,
        rid: str | None = None,
        service_tier: str | None = None,
        extra_headers: Mapping[str, str] | None = None,
        extra_query: Mapping[str, str | int] | None = None,
        extra_body: Mapping[str, Any] | None = None,
        max_retries: int | NotGiven = NOT_GIVEN,
        timeout: TimeoutTypes | NotGiven = NOT_GIVEN,
    ) -> AsyncStream[Completion]: ...

    @overload
    async def create(
        self,
        *,
        prompt: str,
        value: Money,
        stream: bool,
        model: str | NotGiven = NOT_GIVEN,
        max_tokens: int | NotGiven = NOT_GIVEN,
        temperature: float | NotGiven = NOT_GIVEN,
        top_p: float | NotGiven = NOT_GIVEN,
        stop: str | list[str] | NotGiven = NOT_GIVEN,
        max_bid: Money | None = None,
        rid: str | None = None,
        service_tier: str | None = None,
        extra_headers: Mapping[str, str] | None = None,
        extra_query: Mapping[str, str | int] | None = None,
        extra_body: Mapping[str, Any] | None = None,
        max_retries: int | NotGiven = NOT_GIVEN,
        timeout: TimeoutTypes | NotGiven = NOT_GIVEN,
    ) -> Completion | AsyncStream[Completion]: ...

    async def create(
        self,
        *,
        prompt: str,
        value: Money,
        stream: bool = False,
        model: str | NotGiven = NOT_GIVEN,
        max_tokens: int | NotGiven = NOT_GIVEN,
        temperature: float | NotGiven = NOT_GIVEN,
        top_p: float | NotGiven = NOT_GIVEN,
        stop: str | list[str] | NotGiven = NOT_GIVEN,
        max_bid: Money | None = None,
        rid: str | None = None,
        service_tier: str | None = None,
        extra_headers: Mapping[str, str] | None = None,
        extra_query: Mapping[str, str | int] | None = None,
        extra_body: Mapping[str, Any] | None = None,
        max_retries: int | NotGiven = NOT_GIVEN,
        timeout: TimeoutTypes | NotGiven = NOT_GIVEN,
    ) -> Completion | AsyncStream[Completion]:
        """A text completion of `prompt`, bidding for priority worth `value` credits."""
        result, _ = await self._client._completion(
            prompt,
            value=value,
            stream=stream,
            fields={
                "model": model,
                "max_tokens": max_tokens,
                "temperature": temperature,
                "top_p": top_p,
                "stop": stop,
            },
            max_bid=max_bid,
            rid=rid,
            options=_options(
                extra_headers, extra_query, extra_body, service_tier, max_retries, timeout
            ),
        )
        return result


class AsyncRawResponses:
    """`client.with_raw_response`: each call returns a `RawResponse` around its result."""

    def __init__(self, client: AsyncAuctionClient) -> None:
        self._client = client

    async def generate(self, prompt: str, **kwargs: Any) -> RawResponse[Any]:
        """`generate` with the HTTP response."""
        client = self._client
        options, rest = _split_options(kwargs)
        result, response = await client._generate(prompt, options=options, **_generate_args(rest))
        return RawResponse(response, result)

    async def chat(self, messages: Iterable[ChatMessageParam], **kwargs: Any) -> RawResponse[Any]:
        """`chat` with the HTTP response."""
        options, rest = _split_options(kwargs)
        result, response = await self._client._chat(messages, options=options, **_openai_args(rest))
        return RawResponse(response, result)

    async def completions(self, *, prompt: str, **kwargs: Any) -> RawResponse[Any]:
        """`completions.create` with the HTTP response."""
        options, rest = _split_options(kwargs)
        result, response = await self._client._completion(
            prompt, options=options, **_openai_args(rest)
        )
        return RawResponse(response, result)
