"""A small HTTP/1.1 client for an engine's JSON API, sized for the serving path's CPU budget.

The engine backend sends every generation as one HTTP request and reads it back as a few
server-sent events. A general-purpose client spends more CPU per request on its own
bookkeeping (pool scheduling, socket wrappers, tracing hooks, line iteration) than the rest of
the request's handling, so this one does only what the engine needs:

* One keep-alive pool per client (one client per base URL): an idle connection is reused, the
  most recently used first (the likeliest still open); when none is idle a new one is opened,
  without a limit, because a whole batch is sent at once and a cap would put a second queue in
  front of the engine's own.
* Connections are `asyncio.Protocol`s; responses are parsed by `httptools` (llhttp, in C), so
  Python runs once per received segment, never per byte or per line.
* Request bodies are JSON serialized by orjson; numpy arrays serialize as lists.
* Response bodies are delimited by Content-Length or chunked encoding. A body delimited by the
  end of the connection is not supported (uvicorn, which serves SGLang, never sends one): an
  end of connection before the end of the body is a cut (`ConnectionLost`).
* `StreamingResponse.events()` splits a body into server-sent events and yields each event's
  `data:` payload as bytes, leaving the decoding to the caller.
* `https://` URLs are served over TLS with the certificate and host name checked, against the
  system's certificate authorities or those of the `ssl.SSLContext` given; the connect timeout
  covers the handshake, and a certificate that fails the check is a `ConnectError` that says so.
* A connect timeout, and one deadline for the whole request (connect, send, every byte of the
  answer). A request that ends early (cancelled, failed, past its deadline, or not read to its
  end) closes its connection: the server sees the disconnect and aborts the generation.
* `on_sent` is called once the request has been handed entirely to the kernel: the write
  buffer's high-water mark is 0, so `pause_writing` says when a write did not go through at
  once, and `resume_writing` when it has.
* A stream may be written before its block is entered (`StreamRequest.send_now`), when an idle
  connection is at hand: a caller can then write a whole batch of requests in order in one
  turn of the event loop and read each answer in a task of its own. A stream sent that way
  and never entered must be `abandon`ed, which closes its connection.

Retrying on a stale connection. A server closes idle keep-alive connections on its own
schedule (uvicorn after 5 s), and its close can cross a request being written on the reused
connection: the write then fails, or the answer is an immediate end of connection or reset
before any byte of a response. A POST to `/generate` is not idempotent, and SGLang does not
deduplicate by `rid`, so a blind retry could run a generation twice. The client retries only in
that one case: a *reused* connection that fails with `ConnectionLost` before *any* response
byte, and only once, on a freshly opened connection. A server that closed an idle connection
never read the request from it (it has stopped reading the socket); the one case that looks
the same is an engine that read the request and then died without answering, and then the
first attempt's generation died with it (its connection is gone, so SGLang aborts it; were it
somehow still running, SGLang refuses the retry's duplicate `rid` with a 400). A timeout, a
parse error, a refused connect or a failure on a fresh connection are never retried.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator, Callable
from types import TracebackType
from typing import Any, cast
from urllib.parse import urlsplit

import httptools
import orjson

__all__ = [
    "ConnectError",
    "ConnectTimeout",
    "ConnectionLost",
    "DeadlineExceeded",
    "HTTPClient",
    "HTTPClientError",
    "HTTPTimeout",
    "Response",
    "StreamRequest",
    "StreamingResponse",
]

# Reading pauses while this many body bytes wait for a slow consumer.
_READ_BUFFER_LIMIT = 1 << 20
_JSON_OPTIONS = orjson.OPT_SERIALIZE_NUMPY


class HTTPClientError(Exception):
    """A request got no complete answer."""


class ConnectError(HTTPClientError):
    """No connection could be opened (refused, unreachable, unknown host)."""


class HTTPTimeout(HTTPClientError):
    """A time limit passed."""


class ConnectTimeout(HTTPTimeout):
    """Opening a connection took longer than the connect timeout."""


class DeadlineExceeded(HTTPTimeout):
    """The request's deadline passed before its answer ended."""


class ConnectionLost(HTTPClientError):
    """The connection closed, reset or sent something unreadable before the answer ended."""


class _Connection(asyncio.Protocol):
    """One keep-alive connection; it carries one request at a time (no pipelining)."""

    def __init__(self, client: HTTPClient, loop: asyncio.AbstractEventLoop) -> None:
        self._client = client
        self._loop = loop
        self._transport: asyncio.Transport | None = None
        self._parser = httptools.HttpResponseParser(self)
        self.closed = False
        self.reused = False  # it has served a response before the current one
        self.active = False
        self._begin()

    def _begin(self) -> None:
        """Forget the previous exchange."""
        self.status = 0
        self.head_done = False
        self.complete = False
        self.keep_alive = False
        self.received = False  # any byte of the answer
        self.error: HTTPClientError | None = None
        self._body: list[bytes] = []
        self._buffered = 0
        self._reading_paused = False
        self._write_paused = False
        self._on_sent: Callable[[], object] | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._deadline: asyncio.TimerHandle | None = None

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement `asyncio.Transport` without deriving from it.
        transport = cast(asyncio.Transport, transport)
        self._transport = transport
        # A high-water mark of 0: any byte the kernel did not take at once pauses writing, so
        # `resume_writing` marks the moment the whole request is on its way.
        transport.set_write_buffer_limits(high=0)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._client._forget(self)
        if self.active and not self.complete and self.error is None:
            reason = f": {exc!r}" if exc is not None else ""
            self.error = ConnectionLost(f"the connection closed before the answer ended{reason}")
        self._cancel_deadline()
        self._wake()

    def data_received(self, data: bytes) -> None:
        if not self.active:  # bytes nobody asked for: nothing more on it can be trusted
            self.close()
            return
        self.received = True
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as error:
            if not self.complete and self.error is None:
                self.error = ConnectionLost(f"unreadable HTTP answer: {error}")
            self.keep_alive = False
            self.close()
        self._wake()

    def eof_received(self) -> bool | None:
        return None  # close the transport; `connection_lost` says what it means

    def pause_writing(self) -> None:
        self._write_paused = True

    def resume_writing(self) -> None:
        self._write_paused = False
        on_sent, self._on_sent = self._on_sent, None
        if on_sent is not None:
            on_sent()

    # httptools callbacks

    def on_message_begin(self) -> None:
        if self.complete:  # a second answer to one request
            raise ConnectionLost("the server sent more than one answer")

    def on_headers_complete(self) -> None:
        self.status = self._parser.get_status_code()
        self.head_done = True

    def on_body(self, body: bytes) -> None:
        self._body.append(body)
        self._buffered += len(body)
        if self._buffered > _READ_BUFFER_LIMIT and not self._reading_paused:
            self._reading_paused = True
            assert self._transport is not None
            self._transport.pause_reading()

    def on_message_complete(self) -> None:
        self.complete = True
        self.keep_alive = self._parser.should_keep_alive()
        self._cancel_deadline()

    # The exchange, driven by the client

    def send(
        self, data: bytes, deadline: float | None, on_sent: Callable[[], object] | None
    ) -> None:
        """Write a request; `on_sent` runs once the kernel has all of it."""
        self._begin()
        self.active = True
        if deadline is not None:
            self._deadline = self._loop.call_at(deadline, self._expire)
        assert self._transport is not None
        self._transport.write(data)
        if on_sent is not None:
            if self._write_paused:
                self._on_sent = on_sent
            else:
                on_sent()

    async def head(self) -> int:
        """Wait for the answer's status line and headers; its status code."""
        while not self.head_done:
            if self.error is not None:
                raise self.error
            await self._wait()
        return self.status

    async def read(self) -> bytes:
        """The body bytes received since the last call; b"" once the body has ended."""
        while not self._body:
            if self.complete:
                return b""
            if self.error is not None:
                raise self.error
            await self._wait()
        body = self._body
        data = body[0] if len(body) == 1 else b"".join(body)
        self._body = []
        self._buffered = 0
        if self._reading_paused:
            self._reading_paused = False
            assert self._transport is not None
            self._transport.resume_reading()
        return data

    def finish(self) -> None:
        """End the exchange: back to the pool if its answer was read cleanly, else closed."""
        self._cancel_deadline()
        reusable = (
            self.complete
            and self.keep_alive
            and self.error is None
            and not self._body
            and not self.closed
        )
        self.active = False
        self._on_sent = None
        if reusable:
            self.reused = True
            self._client._release(self)
        else:
            self.close()

    def close(self) -> None:
        """Close the connection (the server sees the disconnect)."""
        if self._transport is not None and not self._transport.is_closing():
            self._transport.close()

    def is_open(self) -> bool:
        """True while the connection may still carry a request."""
        return not self.closed and self._transport is not None and not self._transport.is_closing()

    def _expire(self) -> None:
        self._deadline = None
        if self.active and not self.complete and self.error is None:
            self.error = DeadlineExceeded("the request's deadline passed")
            self.close()
            self._wake()

    def _cancel_deadline(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    async def _wait(self) -> None:
        waiter = self._loop.create_future()
        self._waiter = waiter
        await waiter

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)


class Response:
    """A whole answer: its status code and body."""

    __slots__ = ("content", "status")

    def __init__(self, status: int, content: bytes) -> None:
        self.status = status
        self.content = content

    def json(self) -> Any:
        """The body parsed as JSON (raises `orjson.JSONDecodeError`, a `ValueError`)."""
        return orjson.loads(self.content)


class StreamingResponse:
    """An answer whose body is read as it comes; use it inside `HTTPClient.stream`."""

    __slots__ = ("_connection", "status")

    def __init__(self, connection: _Connection, status: int) -> None:
        self._connection = connection
        self.status = status

    async def read(self) -> bytes:
        """The rest of the body."""
        parts = []
        while data := await self._connection.read():
            parts.append(data)
        return b"".join(parts)

    async def events(self) -> AsyncIterator[bytes]:
        """The `data:` payload of each server-sent event, as bytes, until the body ends.

        Events are separated by a blank line; comment lines (`:` first) and other fields are
        skipped; the lines of a multi-line payload are joined with `\\n`, and an event cut off
        by the end of the body is dropped, as the event-stream format says.
        """
        read = self._connection.read
        pending = b""
        while data := await read():
            if pending:
                data = pending + data
            if b"\r" in data:
                data = data.replace(b"\r\n", b"\n")
            *blocks, pending = data.split(b"\n\n")
            for block in blocks:
                # The usual event is one `data: ...` line; anything else goes the long way.
                if block.startswith(b"data: ") and b"\n" not in block:
                    yield block[6:]
                else:
                    payload = _event_data(block)
                    if payload is not None:
                        yield payload


def _event_data(block: bytes) -> bytes | None:
    """The `data` field of one event block; None if it has none."""
    lines = [line for line in block.split(b"\n") if line.startswith(b"data")]
    values = []
    for line in lines:
        name, _, value = line.partition(b":")
        if name != b"data":
            continue
        values.append(value[1:] if value.startswith(b" ") else value)
    return b"\n".join(values) if values else None


class StreamRequest:
    """A streamed request: the async context manager `HTTPClient.stream` returns."""

    __slots__ = ("_client", "_connection", "_entered", "_outgoing", "sent_at")

    def __init__(self, client: HTTPClient, outgoing: _Outgoing) -> None:
        self._client = client
        self._outgoing = outgoing
        self._connection: _Connection | None = None
        self._entered = False
        self.sent_at: float | None = None  # the loop's time when the request was written

    def send_now(self) -> bool:
        """Write the request at once if an idle connection is at hand (True); else it is
        written when the block is entered. Enter the block afterwards, or `abandon`."""
        if self._connection is None and not self._entered:
            connection = self._client._idle_connection()
            if connection is not None:
                self._send(connection)
        return self._connection is not None

    def abandon(self) -> None:
        """Close the connection of a request written by `send_now` whose block was never
        entered (the server sees the disconnect and stops); otherwise nothing."""
        if self._connection is not None and not self._entered:
            self._connection.finish()  # its answer was not read: closed, never reused
            self._connection = None

    async def __aenter__(self) -> StreamingResponse:
        self._entered = True
        connection = self._connection
        if connection is None:
            connection = await self._client._open(self._outgoing.deadline)
            self._send(connection)
        connection, status = await self._client._answer(connection, self._outgoing)
        self._connection = connection
        return StreamingResponse(connection, status)

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if self._connection is not None:
            self._connection.finish()
            self._connection = None

    def _send(self, connection: _Connection) -> None:
        self._connection = connection
        self.sent_at = asyncio.get_running_loop().time()
        outgoing = self._outgoing
        connection.send(outgoing.data, outgoing.deadline, outgoing.on_sent)


class _Outgoing:
    """A request ready to write: its bytes, its deadline on the loop's clock, and `on_sent`."""

    __slots__ = ("data", "deadline", "on_sent")

    def __init__(
        self, data: bytes, deadline: float | None, on_sent: Callable[[], object] | None
    ) -> None:
        self.data = data
        self.deadline = deadline
        self.on_sent = on_sent


class HTTPClient:
    """Requests to one `http[s]://host:port[/prefix]` over a pool of keep-alive connections.

    `authorization`, when given, is the value of every request's `Authorization` header; it is
    never part of an error message."""

    def __init__(
        self,
        base_url: str,
        *,
        connect_timeout: float | None = 5.0,
        authorization: str | None = None,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"an http:// or https:// URL with a host is needed, got {base_url!r}")
        self.base_url = base_url.rstrip("/")
        self.connect_timeout = connect_timeout
        self._host = parts.hostname
        secure = parts.scheme == "https"
        self._port = parts.port or (443 if secure else 80)
        # An https URL without a context of its own checks against the system's authorities.
        self._ssl = (ssl_context or ssl.create_default_context()) if secure else None
        self._prefix = parts.path.rstrip("/")
        headers = f"Host: {parts.netloc}\r\n"
        if authorization is not None:
            headers += f"Authorization: {authorization}\r\n"
        self._headers = headers.encode("latin-1")
        self._idle: list[_Connection] = []
        self._connections: set[_Connection] = set()
        self._closed = False

    @property
    def open_connections(self) -> int:
        """Connections open now, idle or busy."""
        return len(self._connections)

    @property
    def idle_connections(self) -> int:
        """Connections waiting in the pool for a request."""
        return len(self._idle)

    async def request(
        self,
        method: str,
        path: str,
        json: Any = None,
        *,
        timeout: float | None = None,
        on_sent: Callable[[], object] | None = None,
        headers: bytes = b"",
    ) -> Response:
        """Send a request and read its whole answer; `timeout` bounds all of it. `headers`:
        more header lines (`name: value\r\n`), sent as given."""
        outgoing = self._outgoing(method, path, json, timeout, on_sent, headers)
        connection, status = await self._exchange(outgoing)
        try:
            parts = []
            while data := await connection.read():
                parts.append(data)
        finally:
            connection.finish()
        return Response(status, parts[0] if len(parts) == 1 else b"".join(parts))

    def stream(
        self,
        method: str,
        path: str,
        json: Any = None,
        *,
        timeout: float | None = None,
        on_sent: Callable[[], object] | None = None,
        headers: bytes = b"",
    ) -> StreamRequest:
        """`async with client.stream(...) as response:` reads the body as it comes.

        Leaving the block before the body's end closes the connection. The request is written
        when the block is entered, or before with `send_now()`.
        """
        return StreamRequest(self, self._outgoing(method, path, json, timeout, on_sent, headers))

    async def aclose(self) -> None:
        """Close every connection; requests still running fail with `ConnectionLost`."""
        self._closed = True
        for connection in list(self._connections):
            connection.close()
        self._idle.clear()
        await asyncio.sleep(0)  # let the transports report their end

    def _encode(self, method: str, path: str, body: Any, headers: bytes = b"") -> bytes:
        start = f"{method} {self._prefix}{path} HTTP/1.1\r\n".encode("latin-1") + self._headers
        if headers:
            start += headers
        if body is None:
            if method == "GET":
                return start + b"\r\n"
            return start + b"Content-Length: 0\r\n\r\n"
        payload = orjson.dumps(body, option=_JSON_OPTIONS)
        length = b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(payload)
        return start + length + payload

    def _outgoing(
        self,
        method: str,
        path: str,
        body: Any,
        timeout: float | None,
        on_sent: Callable[[], object] | None,
        headers: bytes = b"",
    ) -> _Outgoing:
        """The request encoded, with its deadline counted from now."""
        data = self._encode(method, path, body, headers)
        deadline = None if timeout is None else asyncio.get_running_loop().time() + timeout
        return _Outgoing(data, deadline, on_sent)

    async def _exchange(self, outgoing: _Outgoing) -> tuple[_Connection, int]:
        """Send the request (retrying a stale connection once, see the module docstring) and
        wait for the answer's head; the caller must `finish()` the connection."""
        connection = await self._open(outgoing.deadline)
        connection.send(outgoing.data, outgoing.deadline, outgoing.on_sent)
        return await self._answer(connection, outgoing)

    async def _open(self, deadline: float | None) -> _Connection:
        """An idle connection, or a new one."""
        if self._closed:
            raise ConnectionLost("the client is closed")
        loop = asyncio.get_running_loop()
        return self._idle_connection() or await self._connect(loop, deadline)

    async def _answer(
        self, connection: _Connection, outgoing: _Outgoing
    ) -> tuple[_Connection, int]:
        """Wait for the head of the answer to `outgoing`, already written on `connection`;
        a stale reused connection gets the request again on a fresh one, once."""
        loop = asyncio.get_running_loop()
        while True:
            try:
                return connection, await connection.head()
            except ConnectionLost:
                connection.finish()
                if not (connection.reused and not connection.received):
                    raise
                connection = await self._connect(loop, outgoing.deadline)
                connection.send(outgoing.data, outgoing.deadline, outgoing.on_sent)
            except BaseException:
                connection.finish()
                raise

    def _idle_connection(self) -> _Connection | None:
        if self._closed:
            return None
        idle = self._idle
        while idle:
            connection = idle.pop()
            if connection.is_open():
                return connection
        return None

    async def _connect(
        self, loop: asyncio.AbstractEventLoop, deadline: float | None
    ) -> _Connection:
        limit = self.connect_timeout
        if deadline is not None:
            left = deadline - loop.time()
            limit = left if limit is None else min(limit, left)
        try:
            async with asyncio.timeout(limit):
                _, connection = await loop.create_connection(
                    lambda: _Connection(self, loop),
                    self._host,
                    self._port,
                    ssl=self._ssl,
                    server_hostname=self._host if self._ssl is not None else None,
                )
        except TimeoutError:
            if deadline is not None and loop.time() >= deadline:
                raise DeadlineExceeded(
                    f"the deadline passed connecting to {self.base_url}"
                ) from None
            raise ConnectTimeout(f"connecting to {self.base_url} took over {limit} s") from None
        except ssl.SSLCertVerificationError as error:
            raise ConnectError(
                f"the TLS certificate of {self.base_url} failed the check: "
                f"{error.verify_message or error.reason} (is the engine's CA among those trusted?)"
            ) from None
        except ssl.SSLError as error:
            raise ConnectError(f"the TLS handshake with {self.base_url} failed: {error}") from None
        except OSError as error:
            raise ConnectError(f"cannot connect to {self.base_url}: {error}") from None
        if self._closed:
            connection.close()
            raise ConnectionLost("the client is closed")
        self._connections.add(connection)
        return connection

    def _release(self, connection: _Connection) -> None:
        if self._closed:
            connection.close()
        else:
            self._idle.append(connection)

    def _forget(self, connection: _Connection) -> None:
        self._connections.discard(connection)
        if connection in self._idle:
            self._idle.remove(connection)
