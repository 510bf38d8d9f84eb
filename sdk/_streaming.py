"""Server-sent event streams of `generate` and `chat`.

Iterating a stream yields the `Auction` first, as soon as the batch clears, then text chunks;
`.text_stream` yields the text alone. `client.chat.completions.create(stream=True)` gives a
`ChatCompletionStream` instead, whose items are typed `ChatCompletionChunk`s as OpenAI's client
yields them. Decoding and bookkeeping live in `StreamCore`; the stream classes only move bytes.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import AsyncGenerator, AsyncIterator, Generator, Iterator, Mapping
from types import TracebackType
from typing import Any, Generic, TypeVar

import httpx
import pydantic

from ._exceptions import (
    APIConnectionError,
    APIResponseValidationError,
    APITimeoutError,
    StreamError,
)
from ._models import (
    Auction,
    ChatChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChatMessage,
    Completion,
    CompletionChoice,
    GenerateResponse,
    Generation,
    MetaInfo,
    Usage,
    _Model,
    finish_type,
)
from ._settlement import Settlement

__all__ = [
    "AsyncChatCompletionStream",
    "AsyncStream",
    "ChatCompletionStream",
    "ChatParser",
    "CompletionParser",
    "GenerateParser",
    "SSEDecoder",
    "Stream",
    "StreamCore",
]

R = TypeVar("R", bound=_Model)
_DONE = "[DONE]"


class SSEDecoder:
    """Collects the `data:` lines of server-sent events into one payload per event."""

    def __init__(self) -> None:
        self._data: list[str] = []

    def feed(self, line: str) -> str | None:
        """Take one line; return the event's data when a blank line completes it."""
        if not line:
            return self.flush()
        if line.startswith(":"):
            return None
        name, _, value = line.partition(":")
        if name == "data":
            self._data.append(value.removeprefix(" "))
        return None

    def flush(self) -> str | None:
        """The pending event's data, if any, for a body that ends without a blank line."""
        if not self._data:
            return None
        data = "\n".join(self._data)
        self._data = []
        return data


class StreamParser(ABC, Generic[R]):
    """Turns decoded event payloads into stream items and, at the end, a final result."""

    auction: Auction | None = None
    text: str = ""
    usage: Usage | None = None

    @abstractmethod
    def feed(self, payload: Mapping[str, Any]) -> list[Auction | str]:
        """Items (the auction, then text deltas) carried by one event."""

    @abstractmethod
    def result(self) -> R:
        """The complete response assembled from all events."""

    def _take_auction(self, raw: object) -> list[Auction | str]:
        if self.auction is not None or raw is None:
            return []
        self.auction = Auction.model_validate(raw)
        return [self.auction]


class GenerateParser(StreamParser[Generation]):
    """Events of `POST /generate`: cumulative text with SGLang's `meta_info`."""

    def __init__(self, rid: str) -> None:
        self._rid = rid
        self._meta: MetaInfo | None = None
        self._output_ids: list[int] = []

    def feed(self, payload: Mapping[str, Any]) -> list[Auction | str]:
        """Items carried by one event."""
        event = GenerateResponse.model_validate(payload)
        items = self._take_auction(event.meta_info.auction)
        # Events carry the text so far; one that does not extend it is taken as an increment.
        extends = event.text.startswith(self.text)
        delta = event.text[len(self.text) :] if extends else event.text
        self.text += delta
        if delta:
            items.append(delta)
        self._meta = event.meta_info
        self._output_ids = event.output_ids
        self.usage = event.meta_info.usage()
        return items

    def result(self) -> Generation:
        """The whole generation."""
        if self._meta is None or self.auction is None:
            raise ValueError("the stream ended before the auction cleared")
        return Generation(
            rid=self._rid,
            text=self.text,
            output_ids=self._output_ids,
            finish_reason=finish_type(self._meta.finish_reason),
            finish_reason_detail=self._meta.finish_reason,
            usage=self._meta.usage(),
            auction=self.auction,
            e2e_latency=self._meta.e2e_latency,
            first_token_latency=self._meta.first_token_latency,
        )


class ChatParser(StreamParser[ChatCompletion]):
    """OpenAI-style `chat.completion.chunk` events with an `auction` object on one of them."""

    def __init__(self, rid: str) -> None:
        self._id = rid
        self._model = ""
        self._created = 0
        self._finish_reason: str | None = None
        # Every event as a typed chunk, kept only for a `ChatCompletionStream` to take.
        self.collect_chunks = False
        self._chunks: list[ChatCompletionChunk] = []

    def take_chunks(self) -> list[ChatCompletionChunk]:
        """The chunks received since the last call."""
        chunks, self._chunks = self._chunks, []
        return chunks

    def feed(self, payload: Mapping[str, Any]) -> list[Auction | str]:
        """Items carried by one chunk."""
        if self.collect_chunks:
            self._chunks.append(ChatCompletionChunk.model_validate({"id": self._id, **payload}))
        items = self._take_auction(payload.get("auction"))
        self._id = str(payload.get("id") or self._id)
        self._model = str(payload.get("model") or self._model)
        self._created = int(payload.get("created") or self._created)
        if payload.get("usage"):
            self.usage = Usage.model_validate(payload["usage"])
        for choice in payload.get("choices") or ():
            if choice.get("index", 0) != 0:
                continue
            content = (choice.get("delta") or {}).get("content")
            if content:
                self.text += content
                items.append(content)
            self._finish_reason = choice.get("finish_reason") or self._finish_reason
        return items

    def result(self) -> ChatCompletion:
        """The whole completion."""
        message = ChatMessage(role="assistant", content=self.text)
        return ChatCompletion(
            id=self._id,
            created=self._created,
            model=self._model,
            choices=[ChatChoice(index=0, message=message, finish_reason=self._finish_reason)],
            usage=self.usage,
            auction=self.auction,
        )


class CompletionParser(StreamParser[Completion]):
    """OpenAI-style `text_completion` chunks with an `auction` object on one of them."""

    def __init__(self, rid: str) -> None:
        self._id = rid
        self._model = ""
        self._created = 0
        self._finish_reason: str | None = None

    def feed(self, payload: Mapping[str, Any]) -> list[Auction | str]:
        """Items carried by one chunk."""
        items = self._take_auction(payload.get("auction"))
        self._id = str(payload.get("id") or self._id)
        self._model = str(payload.get("model") or self._model)
        self._created = int(payload.get("created") or self._created)
        if payload.get("usage"):
            self.usage = Usage.model_validate(payload["usage"])
        for choice in payload.get("choices") or ():
            if choice.get("index", 0) != 0:
                continue
            text = choice.get("text")
            if text:
                self.text += text
                items.append(text)
            self._finish_reason = choice.get("finish_reason") or self._finish_reason
        return items

    def result(self) -> Completion:
        """The whole completion."""
        choice = CompletionChoice(index=0, text=self.text, finish_reason=self._finish_reason)
        return Completion(
            id=self._id,
            created=self._created,
            model=self._model,
            choices=[choice],
            usage=self.usage,
            auction=self.auction,
        )


class StreamCore(Generic[R]):
    """What a stream does with each event, with no I/O: parse, settle the bid, raise errors."""

    def __init__(
        self, parser: StreamParser[R], settlement: Settlement, response: httpx.Response
    ) -> None:
        self.parser = parser
        self.settlement = settlement
        self.response = response
        self.request = response.request
        self.done = False
        # The error that ended the stream, raised again by `get_final`.
        self.error: BaseException | None = None

    def final(self) -> R:
        """The complete response; raises what ended the stream if it did not end normally."""
        if self.error is not None:
            raise self.error
        if not self.done:
            raise StreamError("the stream was closed before it ended", self.request, body=None)
        result = self.parser.result()
        result._request_id = self.response.headers.get("x-request-id")
        return result

    def handle(self, data: str) -> list[Auction | str]:
        """Items of one event; sets `done` at the end of the stream."""
        if data.strip() == _DONE:
            self.done = True
            if self.parser.auction is None:
                self.settlement.unknown()
            return []
        try:
            payload = json.loads(data)
        except ValueError as exc:
            raise APIResponseValidationError(self.response, body=data, detail=str(exc)) from exc
        if not isinstance(payload, dict):
            raise APIResponseValidationError(self.response, body=payload, detail="not an object")
        if isinstance(payload.get("error"), dict):
            error = payload["error"]
            message = str(error.get("message") or "stream error")
            failure = StreamError(message, self.request, body=payload)
            failure.request_id = self.response.headers.get("x-request-id")
            self.error = failure
            self.settlement.fail(failure)
            raise failure
        had_auction = self.parser.auction is not None
        try:
            items = self.parser.feed(payload)
        except (pydantic.ValidationError, ValueError, TypeError, AttributeError) as exc:
            raise APIResponseValidationError(self.response, body=payload, detail=str(exc)) from exc
        if not had_auction and self.parser.auction is not None:
            self.settlement.charged(self.parser.auction)
        return items

    def broken(self, exc: Exception | None) -> APIConnectionError:
        """The error for a stream cut short by the network or an early end of the body."""
        if isinstance(exc, httpx.TimeoutException):
            error: APIConnectionError = APITimeoutError(self.request)
        else:
            error = APIConnectionError(self.request, message="The stream ended unexpectedly.")
        self.error = error
        self.settlement.fail(error)
        return error


class _StreamBase(Generic[R]):
    def __init__(self, response: httpx.Response, core: StreamCore[R]) -> None:
        self.response = response
        self._core = core

    @property
    def auction(self) -> Auction | None:
        """The auction outcome, once the batch has cleared."""
        return self._core.parser.auction

    @property
    def text(self) -> str:
        """The text received so far."""
        return self._core.parser.text

    @property
    def usage(self) -> Usage | None:
        """Token counts from the latest event that carried them."""
        return self._core.parser.usage

    @property
    def rid(self) -> str:
        """The request id, which is also its idempotency key."""
        return self._core.settlement.rid

    @property
    def request_id(self) -> str | None:
        """The server's `x-request-id` of this response."""
        value: str | None = self.response.headers.get("x-request-id")
        return value


class Stream(_StreamBase[R]):
    """A response streamed to a synchronous client; use it as a context manager."""

    def __init__(self, response: httpx.Response, core: StreamCore[R]) -> None:
        super().__init__(response, core)
        self._iterator = self._iterate()

    def __iter__(self) -> Iterator[Auction | str]:
        return self._iterator

    def __next__(self) -> Auction | str:
        return next(self._iterator)

    def __enter__(self) -> Stream[R]:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Stop reading and release the connection."""
        self._iterator.close()
        self.response.close()
        # A stream closed before its batch cleared may still be charged by the server.
        self._core.settlement.unknown()

    @property
    def text_stream(self) -> Iterator[str]:
        """The text as it arrives, without the auction (which stays on `.auction`)."""
        return (item for item in self._iterator if isinstance(item, str))

    def get_final(self) -> R:
        """Read the rest of the stream and return the complete response.

        Raises the stream's error if it failed, and `StreamError` if it was closed early.
        """
        for _ in self._iterator:
            pass
        return self._core.final()

    def _iterate(self) -> Generator[Auction | str, None, None]:
        core = self._core
        decoder = SSEDecoder()
        try:
            for line in self.response.iter_lines():
                data = decoder.feed(line)
                if data is not None:
                    yield from core.handle(data)
                if core.done:
                    return
            tail = decoder.flush()
            if tail is not None:
                yield from core.handle(tail)
            if not core.done:
                raise core.broken(None)
        except httpx.TransportError as exc:
            raise core.broken(exc) from exc
        except BaseException as exc:
            # Includes the user stopping early: what the server charged is then unknown
            # unless the auction had already arrived.
            if isinstance(exc, Exception) and core.error is None:
                core.error = exc
            core.settlement.fail(exc)
            raise
        finally:
            self.response.close()


class AsyncStream(_StreamBase[R]):
    """A response streamed to an asynchronous client; use it as an async context manager."""

    def __init__(self, response: httpx.Response, core: StreamCore[R]) -> None:
        super().__init__(response, core)
        self._iterator = self._iterate()

    def __aiter__(self) -> AsyncIterator[Auction | str]:
        return self._iterator

    async def __anext__(self) -> Auction | str:
        return await self._iterator.__anext__()

    async def __aenter__(self) -> AsyncStream[R]:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def close(self) -> None:
        """Stop reading and release the connection."""
        await self._iterator.aclose()
        await self.response.aclose()
        self._core.settlement.unknown()

    @property
    def text_stream(self) -> AsyncIterator[str]:
        """The text as it arrives, without the auction (which stays on `.auction`)."""
        return self._texts()

    async def _texts(self) -> AsyncGenerator[str, None]:
        async for item in self._iterator:
            if isinstance(item, str):
                yield item

    async def get_final(self) -> R:
        """Read the rest of the stream and return the complete response.

        Raises the stream's error if it failed, and `StreamError` if it was closed early.
        """
        async for _ in self._iterator:
            pass
        return self._core.final()

    async def _iterate(self) -> AsyncGenerator[Auction | str, None]:
        core = self._core
        decoder = SSEDecoder()
        try:
            async for line in self.response.aiter_lines():
                data = decoder.feed(line)
                if data is not None:
                    for item in core.handle(data):
                        yield item
                if core.done:
                    return
            tail = decoder.flush()
            if tail is not None:
                for item in core.handle(tail):
                    yield item
            if not core.done:
                raise core.broken(None)
        except httpx.TransportError as exc:
            raise core.broken(exc) from exc
        except BaseException as exc:
            if isinstance(exc, Exception) and core.error is None:
                core.error = exc
            core.settlement.fail(exc)
            raise
        finally:
            await self.response.aclose()


class _ChunkStreamBase:
    """What the chunk streams share: the stream they read, and its figures."""

    def __init__(self, stream: Stream[ChatCompletion] | AsyncStream[ChatCompletion]) -> None:
        self._stream = stream
        parser = stream._core.parser
        assert isinstance(parser, ChatParser)
        parser.collect_chunks = True
        self._parser = parser
        self.response = stream.response

    @property
    def auction(self) -> Auction | None:
        """The auction outcome, once the batch has cleared."""
        return self._stream.auction

    @property
    def text(self) -> str:
        """The text received so far."""
        return self._stream.text

    @property
    def usage(self) -> Usage | None:
        """Token counts from the latest chunk that carried them."""
        return self._stream.usage

    @property
    def rid(self) -> str:
        """The request id, which is also its idempotency key."""
        return self._stream.rid

    @property
    def request_id(self) -> str | None:
        """The server's `x-request-id` of this response."""
        return self._stream.request_id


class ChatCompletionStream(_ChunkStreamBase):
    """A streamed chat completion whose items are `ChatCompletionChunk`s, as OpenAI's client
    yields them (`chunk.choices[0].delta.content`); `.text_stream` yields the text alone."""

    def __init__(self, stream: Stream[ChatCompletion]) -> None:
        super().__init__(stream)
        self._sync = stream
        self._iterator = self._iterate()

    def __iter__(self) -> Iterator[ChatCompletionChunk]:
        return self._iterator

    def __next__(self) -> ChatCompletionChunk:
        return next(self._iterator)

    def __enter__(self) -> ChatCompletionStream:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    @property
    def text_stream(self) -> Iterator[str]:
        """The text as it arrives."""
        return (chunk.text for chunk in self._iterator if chunk.text)

    def close(self) -> None:
        """Stop reading and release the connection."""
        self._iterator.close()
        self._sync.close()

    def get_final(self) -> ChatCompletion:
        """Read the rest of the stream and return the complete response."""
        for _ in self._iterator:
            pass
        return self._sync.get_final()

    def _iterate(self) -> Generator[ChatCompletionChunk, None, None]:
        # The underlying stream yields only events that carry an item (the auction, text);
        # the chunks of the others (the role, the finish reason) come out with the next one.
        for _ in self._sync:
            yield from self._parser.take_chunks()
        yield from self._parser.take_chunks()


class AsyncChatCompletionStream(_ChunkStreamBase):
    """`ChatCompletionStream` for the asynchronous client."""

    def __init__(self, stream: AsyncStream[ChatCompletion]) -> None:
        super().__init__(stream)
        self._async = stream
        self._iterator = self._iterate()

    def __aiter__(self) -> AsyncIterator[ChatCompletionChunk]:
        return self._iterator

    async def __anext__(self) -> ChatCompletionChunk:
        return await self._iterator.__anext__()

    async def __aenter__(self) -> AsyncChatCompletionStream:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    @property
    def text_stream(self) -> AsyncIterator[str]:
        """The text as it arrives."""
        return self._texts()

    async def _texts(self) -> AsyncGenerator[str, None]:
        async for chunk in self._iterator:
            if chunk.text:
                yield chunk.text

    async def close(self) -> None:
        """Stop reading and release the connection."""
        await self._iterator.aclose()
        await self._async.close()

    async def get_final(self) -> ChatCompletion:
        """Read the rest of the stream and return the complete response."""
        async for _ in self._iterator:
            pass
        return await self._async.get_final()

    async def _iterate(self) -> AsyncGenerator[ChatCompletionChunk, None]:
        async for _ in self._async:
            for chunk in self._parser.take_chunks():
                yield chunk
        for chunk in self._parser.take_chunks():
            yield chunk
