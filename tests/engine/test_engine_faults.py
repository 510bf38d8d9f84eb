"""Engine failures map to the right `EngineError`: refused, hung, 5xx, 503, cut or bad streams.

Every fault is played by a real server on a real port (`tests.engine.raw_server`), which writes
raw HTTP: the engine's client meets the same bytes and socket events as against SGLang.
"""

from __future__ import annotations

import asyncio
import json
import socket
from typing import Any

import pytest

from inference_auctions.server.engine.errors import (
    EngineError,
    EngineProtocolError,
    EngineRejected,
    EngineServerError,
    EngineTimeout,
    EngineUnavailable,
)
from inference_auctions.server.engine.protocol import DispatchMode, EngineRequest
from inference_auctions.server.engine.sglang_http import SGLangHTTPEngine
from tests.engine.raw_server import (
    Handler,
    RawRequest,
    RawServer,
    answer,
    chunk,
    chunked_head,
    event,
    response,
    streamed,
)
from tests.processes import free_port

REQUEST = EngineRequest("r1", [1, 2, 3], {"max_new_tokens": 2}, priority=1)
STREAMED = EngineRequest("r1", [1, 2, 3], {"max_new_tokens": 2}, priority=1, stream=True)


def _meta(finish_reason: dict[str, Any] | None, tokens: int = 1) -> dict[str, Any]:
    return {"id": "r1", "finish_reason": finish_reason, "completion_tokens": tokens}


async def _generate(handler: Handler, request: EngineRequest = REQUEST) -> EngineError:
    async with RawServer(handler) as server:
        engine = SGLangHTTPEngine(server.url)
        await engine.start()
        try:
            with pytest.raises(EngineError) as caught:
                await engine.generate(request)
        finally:
            await engine.close()
    return caught.value


@pytest.mark.anyio
async def test_a_refused_connection_is_unavailable() -> None:
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


@pytest.mark.anyio
async def test_an_engine_that_never_answers_times_out() -> None:
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

        error = await run()
    assert error.http_status == 504


@pytest.mark.anyio
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
async def test_error_statuses_map_to_engine_errors(
    status: int, body: bytes, kind: type[EngineError], text: str
) -> None:
    error = await _generate(answer(response(status, body)))
    assert type(error) is kind
    assert error.engine_status == status
    assert text in error.message


@pytest.mark.anyio
async def test_a_body_that_is_not_json_is_a_protocol_error() -> None:
    error = await _generate(answer(response(200, b"<html>")))
    assert isinstance(error, EngineProtocolError)


@pytest.mark.anyio
async def test_an_aborted_request_is_a_failure() -> None:
    reason = {"type": "abort", "message": "out of memory", "status_code": 500}
    body = {"text": "", "output_ids": [], "meta_info": _meta(reason, 0)}
    error = await _generate(answer(response(200, json.dumps(body).encode())))
    assert isinstance(error, EngineServerError)
    assert "out of memory" in error.message


@pytest.mark.anyio
async def test_a_stream_cut_before_its_last_chunk_is_a_protocol_error() -> None:
    first = event({"text": " a", "output_ids": [5], "meta_info": _meta(None)})
    # The connection closes in the middle of the chunked body.
    error = await _generate(answer(chunked_head() + chunk(first), keep=False), STREAMED)
    assert isinstance(error, EngineProtocolError)
    assert "broke" in error.message
    assert error.http_status == 502


@pytest.mark.anyio
async def test_a_stream_that_ends_unfinished_is_a_protocol_error() -> None:
    events = [
        event({"text": " a", "output_ids": [5], "meta_info": _meta(None)}),
        b"data: [DONE]\n\n",
    ]
    error = await _generate(answer(streamed(events)), STREAMED)
    assert isinstance(error, EngineProtocolError)
    assert "before the request finished" in error.message


@pytest.mark.anyio
async def test_an_event_that_is_not_json_is_a_protocol_error() -> None:
    error = await _generate(answer(streamed([b"data: {not json\n\n"])), STREAMED)
    assert isinstance(error, EngineProtocolError)
    assert "not JSON" in error.message


@pytest.mark.anyio
async def test_an_error_event_in_a_stream_keeps_its_code() -> None:
    events = [
        event({"text": " a", "output_ids": [5], "meta_info": _meta(None)}),
        event({"error": {"message": "scheduler crashed", "code": 500}}),
        b"data: [DONE]\n\n",
    ]
    error = await _generate(answer(streamed(events)), STREAMED)
    assert isinstance(error, EngineServerError)
    assert "scheduler crashed" in error.message


@pytest.mark.anyio
async def test_an_error_status_on_a_streamed_request_keeps_its_mapping() -> None:
    error = await _generate(answer(response(503, b'{"message": "busy"}')), STREAMED)
    assert isinstance(error, EngineUnavailable)
    assert error.engine_status == 503 and "busy" in error.message


@pytest.mark.anyio
async def test_a_server_that_closes_without_answering_is_unavailable() -> None:
    async def hang_up(_: RawRequest, __: asyncio.StreamReader, ___: asyncio.StreamWriter) -> bool:
        return False

    error = await _generate(hang_up)
    assert isinstance(error, EngineUnavailable)


@pytest.mark.anyio
async def test_a_streamed_result_reads_sglang_events() -> None:
    final = _meta({"type": "length", "length": 2}, 2) | {"first_token_latency": 0.25}
    events = [
        b": keep-alive comment\n\n",
        event({"text": " a", "output_ids": [5], "meta_info": _meta(None)}),
        event({"text": " a b", "output_ids": [5, 6], "meta_info": final}),
        b"data: [DONE]\n\n",
    ]

    async def run() -> Any:
        async with RawServer(answer(streamed(events))) as server:
            engine = SGLangHTTPEngine(server.url)
            await engine.start()
            try:
                return [chunk async for chunk in engine.stream(STREAMED)]
            finally:
                await engine.close()

    chunks = await run()
    assert [c.text for c in chunks] == [" a", " a b"]
    assert chunks[-1].finished and not chunks[0].finished
    assert chunks[-1].meta_info["first_token_latency"] == 0.25


@pytest.mark.anyio
async def test_the_request_body_follows_the_mode() -> None:
    async def handle(
        request: RawRequest, _: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> bool:
        meta = _meta({"type": "length", "length": 1})
        output = {"text": " a", "output_ids": [5], "meta_info": meta}
        if request.json()["stream"]:
            writer.write(streamed([event(output), b"data: [DONE]\n\n"]))
        else:
            writer.write(response(200, json.dumps(output).encode()))
        return True

    async def run(mode: DispatchMode) -> list[RawRequest]:
        async with RawServer(handle) as server:
            engine = SGLangHTTPEngine(server.url, mode=mode, api_key="k-123")
            await engine.start()
            try:
                result = await engine.generate(REQUEST)
                assert result.text == " a"
            finally:
                await engine.close()
        return server.requests

    (priority,) = await run("priority")
    (ordered,) = await run("ordered")
    assert (priority.method, priority.path) == ("POST", "/generate")
    assert priority.headers["authorization"] == "Bearer k-123"
    assert priority.json() == {
        "input_ids": [1, 2, 3],
        "sampling_params": {"max_new_tokens": 2},
        "rid": "r1",
        "stream": False,
        "priority": 1,
    }
    assert ordered.json()["stream"] is True and "priority" not in ordered.json()
