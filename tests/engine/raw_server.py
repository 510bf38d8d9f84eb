"""A misbehaving HTTP server on a real port, for fault tests: it writes raw bytes.

Each request is read (head and Content-Length body) and handed to an async handler with the
connection's reader and writer; the handler writes whatever it likes (a well-formed answer,
half of one, nothing) and returns True to keep the connection for a next request, False to
close it. The server records every connection and request, so tests can see reuse and
disconnects.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any


@dataclass
class RawRequest:
    """One request as the server read it."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    connection: int  # which connection carried it, counted from 0
    index: int  # its position on that connection, counted from 0

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class ConnectionLog:
    """What happened on one connection."""

    requests: int = 0
    closed_by_client: asyncio.Event = field(default_factory=asyncio.Event)


Handler = Callable[[RawRequest, asyncio.StreamReader, asyncio.StreamWriter], Awaitable[bool]]


def response(status: int, body: bytes = b"", headers: Iterable[tuple[str, str]] = ()) -> bytes:
    """A whole answer with a Content-Length."""
    head = f"HTTP/1.1 {status} X\r\nContent-Length: {len(body)}\r\n"
    head += "".join(f"{name}: {value}\r\n" for name, value in headers)
    return head.encode() + b"\r\n" + body


def chunked_head(status: int = 200, headers: Iterable[tuple[str, str]] = ()) -> bytes:
    """The head of a chunked answer."""
    head = f"HTTP/1.1 {status} X\r\nTransfer-Encoding: chunked\r\n"
    head += "content-type: text/event-stream\r\n"
    head += "".join(f"{name}: {value}\r\n" for name, value in headers)
    return head.encode() + b"\r\n"


def chunk(data: bytes) -> bytes:
    """One chunk of a chunked body (b"" is the last one)."""
    return b"%x\r\n" % len(data) + data + b"\r\n"


def event(data: Any) -> bytes:
    """A server-sent event carrying `data` as JSON."""
    return b"data: " + json.dumps(data).encode() + b"\n\n"


def streamed(events: Iterable[bytes]) -> bytes:
    """A whole chunked answer, one chunk per event."""
    return chunked_head() + b"".join(chunk(e) for e in events) + chunk(b"")


def answer(data: bytes, keep: bool = True) -> Handler:
    """A handler that writes `data` to every request."""

    async def handle(_: RawRequest, __: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        writer.write(data)
        await writer.drain()
        return keep

    return handle


class RawServer:
    """`async with RawServer(handler) as server:` serves on `server.url` until the block ends."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.requests: list[RawRequest] = []
        self.connections: list[ConnectionLog] = []
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.url = ""

    async def __aenter__(self) -> RawServer:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        assert self._server is not None
        self._server.close()
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.wait(list(self._tasks))
        await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        log = ConnectionLog()
        number = len(self.connections)
        self.connections.append(log)
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    log.closed_by_client.set()
                    return
                request = self._parse(head, number, log.requests)
                length = int(request.headers.get("content-length", "0"))
                request.body = await reader.readexactly(length)
                self.requests.append(request)
                log.requests += 1
                if not await self.handler(request, reader, writer):
                    if reader.at_eof():
                        log.closed_by_client.set()
                    return
        except (asyncio.IncompleteReadError, ConnectionError):
            log.closed_by_client.set()
        finally:
            writer.close()
            self._tasks.discard(task)

    @staticmethod
    def _parse(head: bytes, connection: int, index: int) -> RawRequest:
        start, *lines = head.decode("latin-1").rstrip("\r\n").split("\r\n")
        method, path, _ = start.split(" ", 2)
        headers = {}
        for line in lines:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        return RawRequest(method, path, headers, b"", connection, index)


async def until_closed(reader: asyncio.StreamReader) -> bool:
    """Hang, reading, until the client closes the connection (a handler's ending)."""
    await reader.read()
    return False


async def wait_for_disconnect(log: ConnectionLog, timeout: float = 2.0) -> None:
    """Wait until the client has closed the connection `log` describes."""
    await asyncio.wait_for(log.closed_by_client.wait(), timeout)
