"""Engine failures map to the right `EngineError`: refused, hung, 5xx, 503, cut or bad streams."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest

from inference_auctions.server.engine.base import DispatchMode, EngineRequest
from inference_auctions.server.engine.errors import (
    EngineError,
    EngineProtocolError,
    EngineRejected,
    EngineServerError,
    EngineTimeout,
    EngineUnavailable,
)
from inference_auctions.server.engine.sglang_http import SGLangHTTPEngine
from tests.processes import free_port

REQUEST = EngineRequest("r1", [1, 2, 3], {"max_new_tokens": 2}, priority=1)


def _meta(finish_reason: dict[str, Any] | None, tokens: int = 1) -> dict[str, Any]:
    return {"id": "r1", "finish_reason": finish_reason, "completion_tokens": tokens}


def _event(data: Any) -> bytes:
    return b"data: " + json.dumps(data).encode() + b"\n\n"


async def _generate(
    handler: Callable[[httpx.Request], httpx.Response], request: EngineRequest = REQUEST
) -> EngineError:
    engine = SGLangHTTPEngine("http://sglang.test", transport=httpx.MockTransport(handler))
    await engine.start()
    try:
        with pytest.raises(EngineError) as caught:
            await engine.generate(request)
    finally:
        await engine.close()
    return caught.value


def test_a_refused_connection_is_unavailable() -> None:
    async def run() -> None:
        engine = SGLangHTTPEngine(f"http://127.0.0.1:{free_port()}")
        await engine.start()
        try:
            assert not await engine.health()
            with pytest.raises(EngineUnavailable) as caught:
                await engine.generate(REQUEST)
            assert caught.value.http_status == 502
            with pytest.raises(EngineUnavailable):
                await engine.tokenize("hello")
        finally:
            await engine.close()

    asyncio.run(run())


def test_an_engine_that_never_answers_times_out() -> None:
    # The kernel completes the connection from the listen backlog; nobody ever reads it.
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        port = silent.getsockname()[1]

        async def run() -> EngineError:
            engine = SGLangHTTPEngine(f"http://127.0.0.1:{port}", request_timeout=0.3)
            await engine.start()
            try:
                with pytest.raises(EngineTimeout) as caught:
                    await engine.generate(REQUEST)
                return caught.value
            finally:
                await engine.close()

        error = asyncio.run(run())
    assert error.http_status == 504


@pytest.mark.parametrize(
    ("status", "body", "kind", "text"),
    [
        (500, b"Internal Server Error", EngineServerError, "Internal Server Error"),
        (
            503,
            b'{"object": "error", "message": "queue full", "code": 503}',
            EngineUnavailable,
            "queue full",
        ),
        (400, b'{"error": {"message": "bad input"}}', EngineRejected, "bad input"),
        (400, b'{"error": "unknown field `x`"}', EngineRejected, "unknown field"),
        (404, b'{"detail": "Not Found"}', EngineRejected, "Not Found"),
    ],
)
def test_error_statuses_map_to_engine_errors(
    status: int, body: bytes, kind: type[EngineError], text: str
) -> None:
    error = asyncio.run(_generate(lambda _: httpx.Response(status, content=body)))
    assert type(error) is kind
    assert error.engine_status == status
    assert text in error.message


def test_a_body_that_is_not_json_is_a_protocol_error() -> None:
    error = asyncio.run(_generate(lambda _: httpx.Response(200, content=b"<html>")))
    assert isinstance(error, EngineProtocolError)


def test_an_aborted_request_is_a_failure() -> None:
    reason = {"type": "abort", "message": "out of memory", "status_code": 500}
    body = {"text": "", "output_ids": [], "meta_info": _meta(reason, 0)}
    error = asyncio.run(_generate(lambda _: httpx.Response(200, json=body)))
    assert isinstance(error, EngineServerError)
    assert "out of memory" in error.message


def _streaming(events: Callable[[], AsyncIterator[bytes]]) -> Callable[[httpx.Request], Any]:
    def handler(_: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=events())

    return handler


STREAMED = EngineRequest("r1", [1, 2, 3], {"max_new_tokens": 2}, priority=1, stream=True)


def test_a_stream_cut_before_its_last_chunk_is_a_protocol_error() -> None:
    async def events() -> AsyncIterator[bytes]:
        yield _event({"text": " a", "output_ids": [5], "meta_info": _meta(None)})
        raise httpx.RemoteProtocolError("peer closed connection without sending complete message")

    error = asyncio.run(_generate(_streaming(events), STREAMED))
    assert isinstance(error, EngineProtocolError)
    assert error.http_status == 502


def test_a_stream_that_ends_unfinished_is_a_protocol_error() -> None:
    async def events() -> AsyncIterator[bytes]:
        yield _event({"text": " a", "output_ids": [5], "meta_info": _meta(None)})
        yield b"data: [DONE]\n\n"

    error = asyncio.run(_generate(_streaming(events), STREAMED))
    assert isinstance(error, EngineProtocolError)
    assert "before the request finished" in error.message


def test_an_error_event_in_a_stream_keeps_its_code() -> None:
    async def events() -> AsyncIterator[bytes]:
        yield _event({"text": " a", "output_ids": [5], "meta_info": _meta(None)})
        yield _event({"error": {"message": "scheduler crashed", "code": 500}})
        yield b"data: [DONE]\n\n"

    error = asyncio.run(_generate(_streaming(events), STREAMED))
    assert isinstance(error, EngineServerError)
    assert "scheduler crashed" in error.message


def test_a_streamed_result_reads_sglang_events() -> None:
    async def events() -> AsyncIterator[bytes]:
        yield b": keep-alive comment\n\n"
        yield _event({"text": " a", "output_ids": [5], "meta_info": _meta(None)})
        final = _meta({"type": "length", "length": 2}, 2) | {"first_token_latency": 0.25}
        yield _event({"text": " a b", "output_ids": [5, 6], "meta_info": final})
        yield b"data: [DONE]\n\n"

    async def run() -> Any:
        engine = SGLangHTTPEngine(
            "http://sglang.test", transport=httpx.MockTransport(_streaming(events))
        )
        await engine.start()
        try:
            return [chunk async for chunk in engine.stream(STREAMED)]
        finally:
            await engine.close()

    chunks = asyncio.run(run())
    assert [c.text for c in chunks] == [" a", " a b"]
    assert chunks[-1].finished and not chunks[0].finished


def test_the_request_body_follows_the_mode() -> None:
    seen: list[dict[str, Any]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(json.loads(request.content))
        meta = _meta({"type": "length", "length": 1})
        if seen[-1]["stream"]:
            event = _event({"text": " a", "output_ids": [5], "meta_info": meta})
            return httpx.Response(200, content=event + b"data: [DONE]\n\n")
        return httpx.Response(200, json={"text": " a", "output_ids": [5], "meta_info": meta})

    async def run(mode: DispatchMode) -> None:
        transport = httpx.MockTransport(handler)
        engine = SGLangHTTPEngine("http://sglang.test", mode=mode, transport=transport)
        await engine.start()
        try:
            result = await engine.generate(REQUEST)
            assert result.text == " a"
        finally:
            await engine.close()

    asyncio.run(run("priority"))
    asyncio.run(run("ordered"))
    priority, ordered = seen
    assert priority == {
        "input_ids": [1, 2, 3],
        "sampling_params": {"max_new_tokens": 2},
        "rid": "r1",
        "stream": False,
        "priority": 1,
    }
    assert ordered["stream"] is True and "priority" not in ordered
