"""The engine's HTTP client against real sockets: pooling, streams, disconnects and deadlines."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np
import pytest

from inference_auctions.server.engine.http_client import (
    ConnectError,
    ConnectionLost,
    DeadlineExceeded,
    HTTPClient,
)
from tests.engine.raw_server import (
    Handler,
    RawRequest,
    RawServer,
    answer,
    chunk,
    chunked_head,
    response,
    until_closed,
    wait_for_disconnect,
)
from tests.processes import free_port

OK = response(200, b'{"ok": true}')


async def _drops_the_second_request_on_the_first_connection(
    request: RawRequest, _: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> bool:
    """As a server whose idle close crosses the second request on a connection: that request
    is dropped unanswered, before any byte of an answer; every other one is answered."""
    if request.connection == 0 and request.index == 1:
        return False
    writer.write(OK)
    return True


async def _run(handler: Handler, body: Callable[[RawServer, HTTPClient], Awaitable[Any]]) -> Any:
    async with RawServer(handler) as server:
        client = HTTPClient(server.url, connect_timeout=2)
        try:
            return await body(server, client)
        finally:
            await client.aclose()


@pytest.mark.anyio
async def test_a_second_request_reuses_the_connection() -> None:
    async def body(server: RawServer, client: HTTPClient) -> None:
        first = await client.request("POST", "/generate", {"a": 1})
        second = await client.request("GET", "/health")
        assert (first.status, first.json()) == (200, {"ok": True})
        assert second.status == 200
        assert len(server.connections) == 1
        assert server.connections[0].requests == 2
        assert client.open_connections == 1 and client.idle_connections == 1
        assert [(r.method, r.path) for r in server.requests] == [
            ("POST", "/generate"),
            ("GET", "/health"),
        ]

    await _run(answer(OK), body)


@pytest.mark.anyio
async def test_concurrent_requests_open_a_connection_each() -> None:
    release = asyncio.Event()

    async def slow(_: RawRequest, __: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        await release.wait()
        writer.write(OK)
        return True

    async def body(server: RawServer, client: HTTPClient) -> None:
        calls = [asyncio.create_task(client.request("GET", "/health")) for _ in range(5)]
        while len(server.requests) < 5:
            await asyncio.sleep(0.01)  # all five reached the server before any answer
        release.set()
        assert [r.status for r in await asyncio.gather(*calls)] == [200] * 5
        assert len(server.connections) == 5
        assert client.idle_connections == 5

    await _run(slow, body)


@pytest.mark.anyio
async def test_connection_close_is_honoured() -> None:
    async def body(server: RawServer, client: HTTPClient) -> None:
        for _ in range(2):
            assert (await client.request("GET", "/health")).status == 200
        assert len(server.connections) == 2
        await asyncio.sleep(0.05)
        assert client.open_connections == 0

    # The server keeps its end open: the client must close on the header alone.
    await _run(answer(response(200, b"{}", [("Connection", "close")]), keep=True), body)


@pytest.mark.anyio
async def test_a_cancelled_stream_closes_its_connection() -> None:
    async def one_event_then_wait(
        _: RawRequest, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> bool:
        writer.write(chunked_head() + chunk(b"data: 1\n\n"))
        return await until_closed(reader)

    async def body(server: RawServer, client: HTTPClient) -> None:
        got: list[bytes] = []

        async def consume() -> None:
            async with client.stream("POST", "/generate", {"stream": True}) as streamed:
                async for payload in streamed.events():
                    got.append(payload)

        task = asyncio.create_task(consume())
        while not got:
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await wait_for_disconnect(server.connections[0])  # the engine sees the abort
        assert got == [b"1"]
        assert client.open_connections == 0

    await _run(one_event_then_wait, body)


@pytest.mark.anyio
async def test_a_stream_left_before_its_end_is_not_reused() -> None:
    async def body(server: RawServer, client: HTTPClient) -> None:
        async with client.stream("POST", "/generate") as streamed:
            assert streamed.status == 200
        await wait_for_disconnect(server.connections[0])
        assert (await client.request("GET", "/health")).status == 200
        assert len(server.connections) == 2

    async def handle(
        request: RawRequest, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> bool:
        if request.path == "/health":
            writer.write(OK)
            return True
        writer.write(chunked_head() + chunk(b"data: 1\n\n"))
        return await until_closed(reader)

    await _run(handle, body)


@pytest.mark.anyio
async def test_a_stream_written_ahead_is_read_when_entered_and_needs_no_connection_of_its_own() -> (
    None
):
    async def body(server: RawServer, client: HTTPClient) -> None:
        await client.request("POST", "/generate", {"n": 1})  # one idle connection now
        sent: list[int] = []
        streaming = client.stream("POST", "/generate", {"n": 2}, on_sent=lambda: sent.append(2))
        assert streaming.send_now()
        assert sent == [2]  # written before the block: `on_sent` ran at once
        later = client.stream("POST", "/generate", {"n": 3})
        assert not later.send_now()  # no idle connection left: written on entering
        async with streaming as first, later as second:
            assert (first.status, second.status) == (200, 200)
            assert (await first.read(), await second.read()) == (b'{"ok": true}',) * 2
        assert [r.json()["n"] for r in server.requests] == [1, 2, 3]
        assert [r.connection for r in server.requests] == [0, 0, 1]

    await _run(answer(OK), body)


@pytest.mark.anyio
async def test_a_stream_written_ahead_on_a_stale_connection_is_sent_again_when_entered() -> None:
    # As for `request`: the idle connection the stream was written on turns out closed
    # before any byte of an answer, so entering the block sends it once more, on a fresh one.
    async def body(server: RawServer, client: HTTPClient) -> None:
        await client.request("POST", "/generate", {"n": 1})
        streaming = client.stream("POST", "/generate", {"n": 2})
        assert streaming.send_now()
        async with streaming as streamed:
            assert streamed.status == 200
        assert [r.json()["n"] for r in server.requests] == [1, 2, 2]
        assert [r.connection for r in server.requests] == [0, 0, 1]

    await _run(_drops_the_second_request_on_the_first_connection, body)


@pytest.mark.anyio
async def test_an_abandoned_stream_closes_its_connection() -> None:
    async def one_event_then_wait(
        request: RawRequest, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> bool:
        if request.index == 0:
            writer.write(OK)
            return True
        writer.write(chunked_head() + chunk(b"data: 1\n\n"))
        return await until_closed(reader)

    async def body(server: RawServer, client: HTTPClient) -> None:
        await client.request("POST", "/generate", {"n": 1})
        streaming = client.stream("POST", "/generate", {"n": 2})
        assert streaming.send_now()
        while len(server.requests) < 2:
            await asyncio.sleep(0.01)
        streaming.abandon()  # never entered: the server sees the disconnect
        await wait_for_disconnect(server.connections[0])
        assert client.open_connections == 0
        streaming.abandon()  # a second time: nothing left to do

    await _run(one_event_then_wait, body)


@pytest.mark.anyio
async def test_events_are_split_on_blank_lines_across_any_segmentation() -> None:
    body_bytes = (
        b": a comment\n\n"
        b'data: {"a": 1}\n\n'
        b"event: note\ndata: first line\ndata: second line\n\n"
        b"data:no space\r\n\r\n"
        b"id: 7\n\n"
        b"data: [DONE]\n\n"
        b"data: cut off"  # no blank line: dropped
    )

    async def dribble(
        _: RawRequest, __: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> bool:
        writer.write(chunked_head())
        for start in range(0, len(body_bytes), 3):  # three bytes a chunk, a write each
            writer.write(chunk(body_bytes[start : start + 3]))
            await writer.drain()
            await asyncio.sleep(0)
        writer.write(chunk(b""))
        return True

    async def body(server: RawServer, client: HTTPClient) -> list[bytes]:
        async with client.stream("POST", "/generate") as streamed:
            payloads = [p async for p in streamed.events()]
        assert client.idle_connections == 1  # read to its end: reusable
        return payloads

    assert await _run(dribble, body) == [
        b'{"a": 1}',
        b"first line\nsecond line",
        b"no space",
        b"[DONE]",
    ]


@pytest.mark.anyio
async def test_content_length_and_chunked_bodies_are_read_whole() -> None:
    big = json.dumps({"tokens": list(range(50_000))}).encode()

    async def handle(
        request: RawRequest, _: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> bool:
        if request.path == "/length":
            writer.write(response(200, big))
        else:
            writer.write(chunked_head() + chunk(big[:1000]) + chunk(big[1000:]) + chunk(b""))
        return True

    async def body(server: RawServer, client: HTTPClient) -> None:
        for path in ("/length", "/chunked", "/length"):
            answer_ = await client.request("GET", path)
            assert answer_.content == big
        assert len(server.connections) == 1

    await _run(handle, body)


@pytest.mark.anyio
async def test_an_idle_connection_the_server_closed_is_survived() -> None:
    async def answer_then_close(
        _: RawRequest, __: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> bool:
        writer.write(OK)
        await writer.drain()
        return False  # the keep-alive connection closes once idle

    async def body(server: RawServer, client: HTTPClient) -> None:
        for _ in range(3):
            assert (await client.request("POST", "/generate", {})).status == 200
            await asyncio.sleep(0.05)
        assert len(server.connections) == 3
        assert len(server.requests) == 3

    await _run(answer_then_close, body)


@pytest.mark.anyio
async def test_a_stale_connection_is_retried_once_on_a_fresh_one() -> None:
    # The close crosses the second request: the server drops it unanswered, on the reused
    # connection, before any byte of an answer. That one request is sent again.
    async def body(server: RawServer, client: HTTPClient) -> None:
        sent: list[int] = []
        await client.request("POST", "/generate", {"n": 1})
        answer_ = await client.request(
            "POST", "/generate", {"n": 2}, on_sent=lambda: sent.append(1)
        )
        assert answer_.status == 200
        assert [r.json()["n"] for r in server.requests] == [1, 2, 2]
        assert [r.connection for r in server.requests] == [0, 0, 1]
        assert sent  # admitted

    await _run(_drops_the_second_request_on_the_first_connection, body)


@pytest.mark.anyio
async def test_no_retry_once_an_answer_started_or_on_a_fresh_connection() -> None:
    async def half_an_answer(
        request: RawRequest, _: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> bool:
        if request.index == 0 and request.connection == 0:
            writer.write(OK)
            return True
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Le")  # then the connection drops
        return False

    async def body(server: RawServer, client: HTTPClient) -> None:
        await client.request("POST", "/generate", {})
        with pytest.raises(ConnectionLost):
            await client.request("POST", "/generate", {})  # reused, but bytes came: no retry
        with pytest.raises(ConnectionLost):
            await client.request("POST", "/generate", {})  # fresh: never retried
        assert len(server.requests) == 3

    await _run(half_an_answer, body)


@pytest.mark.anyio
async def test_a_body_cut_short_is_connection_lost() -> None:
    async def body(server: RawServer, client: HTTPClient) -> None:
        with pytest.raises(ConnectionLost):
            await client.request("GET", "/health")
        assert client.open_connections == 0

    await _run(answer(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n12345", keep=False), body)


@pytest.mark.anyio
async def test_garbage_is_connection_lost() -> None:
    async def body(server: RawServer, client: HTTPClient) -> None:
        with pytest.raises(ConnectionLost, match="unreadable"):
            await client.request("GET", "/health")

    await _run(answer(b"SMTP ready\r\n\r\n", keep=True), body)


@pytest.mark.anyio
async def test_the_deadline_covers_the_whole_request_and_closes_the_connection() -> None:
    async def hang(
        _: RawRequest, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> bool:
        writer.write(chunked_head() + chunk(b"data: 1\n\n"))  # starts, then never ends
        return await until_closed(reader)

    async def body(server: RawServer, client: HTTPClient) -> float:
        loop = asyncio.get_running_loop()
        start = loop.time()
        with pytest.raises(DeadlineExceeded):
            async with client.stream("POST", "/generate", timeout=0.2) as streamed:
                async for _ in streamed.events():
                    pass
        await wait_for_disconnect(server.connections[0])
        return loop.time() - start

    elapsed = await _run(hang, body)
    # Not before the deadline (the loop's clock); after it, as soon as a loaded machine runs
    # the loop: without a deadline over the whole request the stream would hang for good.
    assert 0.2 <= elapsed < 5.0


@pytest.mark.anyio
async def test_a_refused_connection_is_a_connect_error() -> None:
    client = HTTPClient(f"http://127.0.0.1:{free_port()}")
    with pytest.raises(ConnectError):
        await client.request("GET", "/health")


@pytest.mark.anyio
async def test_on_sent_waits_until_the_kernel_has_the_whole_body() -> None:
    # 32 MB is far beyond what loopback socket buffers hold, so the server must read before
    # the client may say that the request is sent.
    big = {"input_ids": np.arange(4_000_000, dtype=np.int64)}

    reading, served = asyncio.Event(), asyncio.Event()
    received: list[bytes] = []

    async def gated(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await reading.wait()  # nothing is read from the socket before this
            head = await reader.readuntil(b"\r\n\r\n")
            length = int(head.split(b"Content-Length: ")[1].split(b"\r\n")[0])
            received.append(await reader.readexactly(length))
            writer.write(OK)
            await writer.drain()
            await reader.read()
        finally:
            writer.close()
            await writer.wait_closed()
            served.set()

    server = await asyncio.start_server(gated, "127.0.0.1", 0)
    client = HTTPClient(f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}")
    sent: list[bool] = []
    try:
        task = asyncio.create_task(
            client.request("POST", "/generate", big, on_sent=lambda: sent.append(True))
        )
        await asyncio.sleep(0.3)
        assert not sent  # most of the body still waits in the client
        reading.set()
        assert (await task).status == 200
        assert sent == [True]
    finally:
        await client.aclose()
        await asyncio.wait_for(served.wait(), 5)
        server.close()
        await server.wait_closed()
    assert json.loads(received[0])["input_ids"][-2:] == [3_999_998, 3_999_999]


@pytest.mark.anyio
async def test_numpy_arrays_and_authorization_go_out() -> None:
    async with RawServer(answer(OK)) as server:
        client = HTTPClient(server.url + "/prefix/", authorization="Bearer s3cret")
        try:
            ids = np.array([1, 2, 2**31 - 1], dtype=np.int32)
            ids.flags.writeable = False
            await client.request("POST", "/tokenize", {"ids": ids})
        finally:
            await client.aclose()
    (request,) = server.requests
    assert request.path == "/prefix/tokenize"
    assert request.headers["authorization"] == "Bearer s3cret"
    assert request.headers["content-type"] == "application/json"
    assert request.json() == {"ids": [1, 2, 2**31 - 1]}


def test_only_http_and_https_urls() -> None:
    for url in ("ftp://sglang.example", "sglang.example:30000", "http://"):
        with pytest.raises(ValueError, match=r"http:// or https://"):
            HTTPClient(url)
    # TLS itself: tests/engine/test_engine_access.py
    assert HTTPClient("https://sglang.example")._port == 443
