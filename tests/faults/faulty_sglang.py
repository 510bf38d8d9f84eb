"""An SGLang-compatible test server that fails on purpose.

It answers `/tokenize`, `/health` and `/abort_request` as SGLang does, and `/generate` according
to `mode`, which a test may change at any time:

    ok     stream the whole answer, then `[DONE]`
    hang   take the request and never answer (until the server stops)
    error  answer 500 with SGLang's error body
    cut    stream two chunks, then end the body cleanly: no finished chunk, no `[DONE]`
    reset  stream two chunks, then drop the connection in the middle of the body
    stall  stream one chunk, then send nothing more (until the server stops)

A refused connection needs no mode: stop the server, or never start it. `serve()` runs the app
under uvicorn on a loopback port in a thread; it can be started again on the same port.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
import zlib
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any, Literal

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

Mode = Literal["ok", "hang", "error", "cut", "reset", "stall"]

MAX_MODEL_LEN = 32_768
# A hanging request is answered at the latest after this long, or when the server stops.
HANG_LIMIT_SECONDS = 120.0
ERROR_MESSAGE = "CUDA error: an illegal memory access was encountered"


def token_ids(text: str) -> list[int]:
    """A stable id per whitespace-separated word (this server has no real tokenizer)."""
    return [zlib.crc32(word.encode()) % 50_000 + 1 for word in text.split()]


def _sse(data: Any) -> bytes:
    return b"data: " + json.dumps(data, separators=(",", ":")).encode() + b"\n\n"


@dataclass(frozen=True)
class Received:
    """One `/generate` request as the server got it."""

    rid: str
    priority: int | None
    stream: bool
    prompt_tokens: int
    sampling_params: dict[str, Any]
    # The W3C trace headers it came with (`traceparent`, `tracestate`), when it had them.
    trace_headers: dict[str, str] = field(default_factory=dict)


def _output(rid: str, prompt_tokens: int, produced: int, finished: bool) -> dict[str, Any]:
    """One SGLang output: cumulative text and ids, and meta_info."""
    ids = list(range(1, produced + 1))
    meta = {
        "id": rid,
        "finish_reason": {"type": "length", "length": produced} if finished else None,
        "prompt_tokens": prompt_tokens,
        "completion_tokens": produced,
        "cached_tokens": 0,
    }
    return {"text": "".join(f" w{i}" for i in ids), "output_ids": ids, "meta_info": meta}


class _DroppedStream(Response):
    """A streamed answer that sends its first events, then drops the connection.

    The ASGI app returns without finishing the body; uvicorn then closes the connection, as a
    crashing or killed server would.
    """

    def __init__(self, events: list[bytes]) -> None:
        super().__init__(media_type="text/event-stream")
        self.events = events

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        headers = [(b"content-type", b"text/event-stream")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        for event in self.events:
            await send({"type": "http.response.body", "body": event, "more_body": True})


class FaultySGLang:
    """The server's state: the mode, what it received, and its lifecycle."""

    def __init__(self, mode: Mode = "ok") -> None:
        self.mode: Mode = mode
        self.modes: dict[str, Mode] = {}  # per rid, overriding `mode`
        self.received: list[Received] = []
        self.aborted: list[str] = []
        self._stopping = threading.Event()
        self.app = self._build()

    def _build(self) -> FastAPI:
        app = FastAPI(title="faulty SGLang")
        app.add_api_route("/generate", self.generate, methods=["POST"])
        app.add_api_route("/tokenize", self.tokenize, methods=["POST"])
        app.add_api_route("/health", self.health, methods=["GET"])
        app.add_api_route("/abort_request", self.abort_request, methods=["POST"])
        return app

    async def health(self) -> Response:
        """200, as SGLang's `/health` while it runs."""
        return Response(status_code=HTTPStatus.OK)

    async def tokenize(self, request: Request) -> Response:
        """SGLang's `/tokenize` for one prompt."""
        body = await request.json()
        prompt = body.get("prompt") if isinstance(body, dict) else None
        if not isinstance(prompt, str):
            return JSONResponse(
                {"error": {"message": "prompt must be a string"}},
                status_code=HTTPStatus.BAD_REQUEST,
            )
        tokens = token_ids(prompt)
        return JSONResponse(
            {"tokens": tokens, "count": len(tokens), "max_model_len": MAX_MODEL_LEN}
        )

    async def abort_request(self, request: Request) -> Response:
        """Record the abort; there is nothing to stop."""
        body = await request.json()
        if isinstance(body, dict) and isinstance(body.get("rid"), str):
            self.aborted.append(body["rid"])
        return Response(status_code=HTTPStatus.OK)

    async def generate(self, request: Request) -> Response:
        """`/generate`, failing as `mode` says."""
        body = await request.json()
        rid = str(body.get("rid") or "anonymous")
        prompt = len(body.get("input_ids") or []) or len(token_ids(str(body.get("text") or "")))
        stream = body.get("stream") is True
        sampling = body.get("sampling_params") or {}
        trace = {
            name: request.headers[name]
            for name in ("traceparent", "tracestate")
            if name in request.headers
        }
        self.received.append(Received(rid, body.get("priority"), stream, prompt, sampling, trace))
        mode = self.modes.get(rid, self.mode)
        if mode == "hang":
            await self._until_stopped()
            return Response(status_code=HTTPStatus.SERVICE_UNAVAILABLE)
        if mode == "error":
            error = {"object": "error", "message": ERROR_MESSAGE, "type": "500", "param": None}
            return JSONResponse(
                {**error, "code": 500}, status_code=HTTPStatus.INTERNAL_SERVER_ERROR
            )
        if mode == "reset":
            return _DroppedStream([_sse(_output(rid, prompt, k, False)) for k in (1, 2)])
        length = int(sampling.get("max_new_tokens") or 4)
        if not stream:
            if mode != "ok":
                await self._until_stopped()
            return JSONResponse(_output(rid, prompt, length, True))
        return StreamingResponse(
            self._events(rid, prompt, length, mode), media_type="text/event-stream"
        )

    async def _events(self, rid: str, prompt: int, length: int, mode: Mode) -> AsyncIterator[bytes]:
        if mode == "cut":
            for produced in (1, 2):
                yield _sse(_output(rid, prompt, produced, False))
            return
        if mode == "stall":
            yield _sse(_output(rid, prompt, 1, False))
            await self._until_stopped()
            return
        for produced in range(1, length + 1):
            yield _sse(_output(rid, prompt, produced, produced == length))
            await asyncio.sleep(0)
        yield b"data: [DONE]\n\n"

    async def _until_stopped(self) -> None:
        deadline = time.monotonic() + HANG_LIMIT_SECONDS
        while not self._stopping.is_set() and time.monotonic() < deadline:
            await asyncio.sleep(0.05)

    @contextmanager
    def serve(self, port: int | None = None) -> Iterator[str]:
        """Run under uvicorn on 127.0.0.1 (`port` or a free one) until the block ends."""
        self._stopping.clear()
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", port or 0))
        bound = listener.getsockname()[1]
        config = uvicorn.Config(
            self.app, log_level="critical", lifespan="off", timeout_graceful_shutdown=5
        )
        server = uvicorn.Server(config)
        thread = threading.Thread(target=server.run, kwargs={"sockets": [listener]}, daemon=True)
        thread.start()
        deadline = time.monotonic() + 10
        while not server.started:
            if not thread.is_alive() or time.monotonic() > deadline:
                listener.close()
                raise RuntimeError("the faulty SGLang server did not start")
            time.sleep(0.01)
        try:
            yield f"http://127.0.0.1:{bound}"
        finally:
            self._stopping.set()  # hanging requests answer now, so shutdown is quick
            server.should_exit = True
            thread.join(15)
            listener.close()
