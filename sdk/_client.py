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

from ._base_client import BaseClient, Call, ChatMessageParam
from ._budget import Budget
from ._constants import DEFAULT_MAX_RETRIES, DEFAULT_TIMEOUT
from ._exceptions import ConfigurationError, make_status_error
from ._ledger import AsyncLedger, Ledger
from ._models import ChatCompletion, Generation
from ._streaming import AsyncStream, ChatParser, GenerateParser, Stream, StreamCore
from ._types import NOT_GIVEN, Money, NotGiven, TimeoutTypes

__all__ = ["AsyncAuctionClient", "AuctionClient"]

_M = TypeVar("_M", bound=pydantic.BaseModel)


class AuctionClient(BaseClient):
    """A synchronous client that bids for you under a budget; safe to share between threads.

    **Parameters:**

    * **base_url** - the server, e.g. "http://127.0.0.1:8000"; else `INFERENCE_AUCTION_BASE_URL`.
    * **api_key** - sent as a bearer token; else `INFERENCE_AUCTION_API_KEY`.
    * **budget** - what the pacing bidder may spend, and over which horizon.
    * **timeout** - per request; defaults to 600 s with 5 s to connect.
    * **max_retries** - retries of connection errors, 408, 409, 429 and 5xx.
    * **state_file** - a JSON file that keeps the pacing state across restarts.
    * **sync_on_start** - take the spend so far from the ledger before the first bid.
    * **default_headers** - extra headers on every request.
    * **http_client** / **transport** - an `httpx.Client` to use, or a transport for a new one.
    * **clock** - the wall clock (`time.time`) that periodic budgets follow.
    """

    def __init__(
        self,
        base_url: str | httpx.URL | None = None,
        api_key: str | None = None,
        *,
        budget: Budget,
        timeout: TimeoutTypes | NotGiven = NOT_GIVEN,
        max_retries: int = DEFAULT_MAX_RETRIES,
        state_file: str | os.PathLike[str] | None = None,
        sync_on_start: bool = True,
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
            default_headers=default_headers,
            clock=clock,
            client_timeout=DEFAULT_TIMEOUT if http_client is None else http_client.timeout,
        )
        self._owns_http = http_client is None
        self._http = http_client or httpx.Client(transport=transport, timeout=self._timeout)
        self._sync_lock = threading.Lock()
        self.ledger = Ledger(self)
        """Balance, entries and summaries of the account's ledger."""

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

    def sync(self) -> None:
        """Take the spend so far from the server's ledger (done once before the first bid)."""
        if not (self._sync_uses_balance() and self._apply_balance(self.ledger.balance())):
            self._apply_entries(self.ledger.iter_entries(since=self._bidder.spend_since))
        self._synced = True

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
        timeout: TimeoutTypes | NotGiven = NOT_GIVEN,
    ) -> Stream[Generation]: ...

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
        timeout: TimeoutTypes | NotGiven = NOT_GIVEN,
    ) -> Generation | Stream[Generation]:
        """Generate text for `prompt`, bidding for priority worth `value` credits to you."""
        self._ensure_synced()
        call = self._generate_call(
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
        )
        response = self._post(call, "/generate", stream=stream, timeout=timeout)
        if stream:
            parser = GenerateParser(call.rid)
            return Stream(response, StreamCore(parser, call.settlement, response))
        return self._complete(call, response, self._generation)

    @overload
    def chat(
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
        extra_body: Mapping[str, Any] | None = None,
        max_bid: Money | None = None,
        rid: str | None = None,
        timeout: TimeoutTypes | NotGiven = NOT_GIVEN,
    ) -> ChatCompletion: ...

    @overload
    def chat(
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
        extra_body: Mapping[str, Any] | None = None,
        max_bid: Money | None = None,
        rid: str | None = None,
        timeout: TimeoutTypes | NotGiven = NOT_GIVEN,
    ) -> Stream[ChatCompletion]: ...

    def chat(
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
        extra_body: Mapping[str, Any] | None = None,
        max_bid: Money | None = None,
        rid: str | None = None,
        timeout: TimeoutTypes | NotGiven = NOT_GIVEN,
    ) -> ChatCompletion | Stream[ChatCompletion]:
        """An OpenAI-style chat completion, bidding for priority worth `value` credits."""
        self._ensure_synced()
        call = self._chat_call(
            messages,
            value=value,
            stream=stream,
            options={
                "model": model,
                "max_tokens": max_tokens,
                "temperature": temperature,
                "top_p": top_p,
                "stop": stop,
            },
            extra_body=extra_body,
            max_bid=max_bid,
            rid=rid,
        )
        response = self._post(call, "/v1/chat/completions", stream=stream, timeout=timeout)
        if stream:
            parser = ChatParser(call.rid)
            return Stream(response, StreamCore(parser, call.settlement, response))
        return self._complete(call, response, self._chat_completion)

    # -- I/O ---------------------------------------------------------------------------------

    def _ensure_synced(self) -> None:
        if self._synced or not self._sync_on_start:
            return
        with self._sync_lock:
            if not self._synced:
                self.sync()

    def _post(
        self, call: Call, path: str, *, stream: bool, timeout: TimeoutTypes | NotGiven
    ) -> httpx.Response:
        try:
            response = self._send("POST", path, json=call.body, stream=stream, timeout=timeout)
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
        timeout: TimeoutTypes | NotGiven = NOT_GIVEN,
    ) -> httpx.Response:
        """Send with retries; the body, and so the rid, is the same on every attempt."""
        reached = False
        attempt = 0
        while True:
            request = self._http.build_request(
                method,
                self._url(path),
                json=json,
                params=params,
                headers=self._headers(stream=stream),
                timeout=self._timeout_for(timeout),
            )
            try:
                response = self._http.send(request, stream=stream)
            except httpx.TransportError as exc:
                reached = reached or self._may_have_reached_server(exc)
                if attempt >= self._max_retries:
                    raise self._connection_error(exc, request, reached) from exc
                time.sleep(self._retry_delay(attempt, None))
                attempt += 1
                continue
            if response.is_success:
                return response
            response.read()
            response.close()
            if attempt >= self._max_retries or not self._should_retry(response):
                raise make_status_error(response)
            time.sleep(self._retry_delay(attempt, response))
            attempt += 1


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
        budget: Budget,
        timeout: TimeoutTypes | NotGiven = NOT_GIVEN,
        max_retries: int = DEFAULT_MAX_RETRIES,
        state_file: str | os.PathLike[str] | None = None,
        sync_on_start: bool = True,
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
            default_headers=default_headers,
            clock=clock,
            client_timeout=DEFAULT_TIMEOUT if http_client is None else http_client.timeout,
        )
        self._owns_http = http_client is None
        self._http = http_client or httpx.AsyncClient(transport=transport, timeout=self._timeout)
        self._sync_lock = anyio.Lock()
        self.ledger = AsyncLedger(self)
        """Balance, entries and summaries of the account's ledger."""

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

    async def sync(self) -> None:
        """Take the spend so far from the server's ledger (done once before the first bid)."""
        if not (self._sync_uses_balance() and self._apply_balance(await self.ledger.balance())):
            since = self._bidder.spend_since
            self._apply_entries([e async for e in self.ledger.iter_entries(since=since)])
        self._synced = True

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
        timeout: TimeoutTypes | NotGiven = NOT_GIVEN,
    ) -> AsyncStream[Generation]: ...

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
        timeout: TimeoutTypes | NotGiven = NOT_GIVEN,
    ) -> Generation | AsyncStream[Generation]:
        """Generate text for `prompt`, bidding for priority worth `value` credits to you."""
        await self._ensure_synced()
        call = self._generate_call(
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
        )
        response = await self._post(call, "/generate", stream=stream, timeout=timeout)
        if stream:
            parser = GenerateParser(call.rid)
            return AsyncStream(response, StreamCore(parser, call.settlement, response))
        return self._complete(call, response, self._generation)

    @overload
    async def chat(
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
        extra_body: Mapping[str, Any] | None = None,
        max_bid: Money | None = None,
        rid: str | None = None,
        timeout: TimeoutTypes | NotGiven = NOT_GIVEN,
    ) -> ChatCompletion: ...

    @overload
    async def chat(
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
        extra_body: Mapping[str, Any] | None = None,
        max_bid: Money | None = None,
        rid: str | None = None,
        timeout: TimeoutTypes | NotGiven = NOT_GIVEN,
    ) -> AsyncStream[ChatCompletion]: ...

    async def chat(
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
        extra_body: Mapping[str, Any] | None = None,
        max_bid: Money | None = None,
        rid: str | None = None,
        timeout: TimeoutTypes | NotGiven = NOT_GIVEN,
    ) -> ChatCompletion | AsyncStream[ChatCompletion]:
        """An OpenAI-style chat completion, bidding for priority worth `value` credits."""
        await self._ensure_synced()
        call = self._chat_call(
            messages,
            value=value,
            stream=stream,
            options={
                "model": model,
                "max_tokens": max_tokens,
                "temperature": temperature,
                "top_p": top_p,
                "stop": stop,
            },
            extra_body=extra_body,
            max_bid=max_bid,
            rid=rid,
        )
        response = await self._post(call, "/v1/chat/completions", stream=stream, timeout=timeout)
        if stream:
            parser = ChatParser(call.rid)
            return AsyncStream(response, StreamCore(parser, call.settlement, response))
        return self._complete(call, response, self._chat_completion)

    # -- I/O ---------------------------------------------------------------------------------

    async def _ensure_synced(self) -> None:
        if self._synced or not self._sync_on_start:
            return
        async with self._sync_lock:
            if not self._synced:
                await self.sync()

    async def _post(
        self, call: Call, path: str, *, stream: bool, timeout: TimeoutTypes | NotGiven
    ) -> httpx.Response:
        try:
            response = await self._send(
                "POST", path, json=call.body, stream=stream, timeout=timeout
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
        timeout: TimeoutTypes | NotGiven = NOT_GIVEN,
    ) -> httpx.Response:
        """Send with retries; the body, and so the rid, is the same on every attempt."""
        reached = False
        attempt = 0
        while True:
            request = self._http.build_request(
                method,
                self._url(path),
                json=json,
                params=params,
                headers=self._headers(stream=stream),
                timeout=self._timeout_for(timeout),
            )
            try:
                response = await self._http.send(request, stream=stream)
            except httpx.TransportError as exc:
                reached = reached or self._may_have_reached_server(exc)
                if attempt >= self._max_retries:
                    raise self._connection_error(exc, request, reached) from exc
                await anyio.sleep(self._retry_delay(attempt, None))
                attempt += 1
                continue
            if response.is_success:
                return response
            await response.aread()
            await response.aclose()
            if attempt >= self._max_retries or not self._should_retry(response):
                raise make_status_error(response)
            await anyio.sleep(self._retry_delay(attempt, response))
            attempt += 1
