"""An HTTP server that speaks SGLang 0.5.23's native API, backed by the emulated engine.

It is an emulator, not SGLang: no model runs. Scheduling, the radix cache and time follow
`server.emulator.simulator`; completions are deterministic word sequences; token ids come from
the default tokenizer. What matches SGLang is the contract a client sees (as SGLang 0.5.23's
source defines it): `/generate` streamed and not, with SGLang's `meta_info` (as with
`--enable-metrics`), its three error shapes (a 400 `{"error": "<text>"}` for a body that breaks
the JSON contract, such as an unknown `sampling_params` key; a 400 `{"error": {"message": ...}}`
for bad input such as a duplicate in-flight rid, sent inside the stream for a streamed request;
`{"object": "error", "message": ..., "code": ...}` for an abort with another status), and
`/tokenize`, `/detokenize`, `/health`, `/health_generate`, `/ready`, `/v1/models`,
`/model_info`, `/server_info`, `/flush_cache`, `/abort_request`, `/v1/loads` and `/metrics`;
and SGLang's OpenAI-compatible `/v1/chat/completions` and `/v1/completions`, streamed and not,
whose bodies `server.emulator.sglang_openai` reads and shapes (the emulator has no chat template:
that module documents the fixed one it uses).
"""

from __future__ import annotations

import dataclasses
import hmac
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from http import HTTPStatus
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.types import ASGIApp, Receive, Scope, Send

from inference_auctions.server.emulator.event_stream import EventStream, watch_disconnect
from inference_auctions.server.emulator.live import LiveRequest, LiveSimulator
from inference_auctions.server.emulator.sglang_openai import (
    OpenAIError,
    OpenAIRequest,
    Shaper,
    finish_reason,
    openai_error_body,
    parse_chat_body,
    parse_completion_body,
    render_chat,
    sendable,
    stop_cut,
)
from inference_auctions.server.emulator.sglang_request import (
    ContractError,
    GenerateInput,
    SamplingOptions,
    check_vocabulary,
    parse_generate_body,
)
from inference_auctions.server.engine.builtin_tokenizer import VOCABULARY_SIZE, piece_id, pieces
from inference_auctions.server.engine.protocol import check_context_length

__all__ = ["create_sglang_app"]

log = logging.getLogger(__name__)


def _emulator_version() -> str:
    try:
        return f"{version('inference-auctions')}-emulator"
    except PackageNotFoundError:
        return "emulator"


_DONE = b"data: [DONE]\n\n"


def _sse(data: Any) -> bytes:
    return b"data: " + json.dumps(data, separators=(",", ":")).encode() + b"\n\n"


def _bad_request(message: str) -> JSONResponse:
    """SGLang's answer to a ValueError raised while handling a request."""
    return JSONResponse({"error": {"message": message}}, status_code=HTTPStatus.BAD_REQUEST)


def _http_error(message: str, status: int) -> JSONResponse:
    """SGLang's answer to an HTTPException (its ErrorResponse shape)."""
    body = {"object": "error", "message": message, "type": str(status), "param": None}
    return JSONResponse({**body, "code": status}, status_code=status)


def _openai_error(
    message: str, param: str | None, status: int = HTTPStatus.BAD_REQUEST
) -> JSONResponse:
    """SGLang's answer to a request its OpenAI layer refuses."""
    return JSONResponse(openai_error_body(message, param, status), status_code=status)


def _error_stream(message: str) -> EventStream:
    """A streamed request that failed before its first chunk, as SGLang streams it."""
    error = {"message": message, "type": "invalid_request_error", "code": 400, "retryable": False}

    async def events() -> AsyncIterator[bytes]:
        yield _sse({"error": error})
        yield _DONE

    return EventStream(events())


class _PieceBook:
    """Token id -> piece, for every piece this server has seen, so `/detokenize` can answer.

    The default tokenizer hashes pieces to ids and cannot be inverted otherwise.
    """

    def __init__(self) -> None:
        self._pieces: dict[int, str] = {}

    def learn(self, text: str) -> list[int]:
        """Tokenize `text` and remember its pieces."""
        ids = []
        for piece in pieces(text):
            token = piece_id(piece)
            self._pieces.setdefault(token, piece)
            ids.append(token)
        return ids

    def decode(self, ids: list[int]) -> str:
        """The text of `ids`; an id never seen becomes U+FFFD."""
        return "".join(self._pieces.get(token, "\ufffd") for token in ids)


_INVALID = object()


async def _body(request: Request) -> Any:
    """The parsed JSON body, or `_INVALID`."""
    try:
        return await request.json()
    except ValueError:
        return _INVALID


def _invalid_json() -> JSONResponse:
    return _http_error("The request body is not valid JSON.", HTTPStatus.BAD_REQUEST)


def _int_list(value: Any) -> list[int] | None:
    if isinstance(value, list) and all(
        isinstance(t, int) and not isinstance(t, bool) for t in value
    ):
        return value
    return None


class _Routes:
    """The emulator's endpoints, as methods sharing the engine and the piece book."""

    def __init__(self, live: LiveSimulator) -> None:
        self.live = live
        self.simulator = live.simulator
        self.capacity = live.simulator.cache.capacity
        self.book = _PieceBook()
        self.started = int(time.time())

    def table(self) -> list[tuple[str, Callable[..., Awaitable[Any]], list[str]]]:
        """Every (path, endpoint, methods), SGLang's deprecated aliases included."""
        get, post = ["GET"], ["POST"]
        return [
            ("/generate", self.generate, ["POST", "PUT"]),
            ("/v1/chat/completions", self.chat_completions, post),
            ("/v1/completions", self.completions, post),
            ("/tokenize", self.tokenize, post),
            ("/v1/tokenize", self.tokenize, post),
            ("/detokenize", self.detokenize, post),
            ("/v1/detokenize", self.detokenize, post),
            ("/health", self.health, get),
            ("/health_generate", self.health, get),
            ("/ready", self.health, get),
            ("/v1/models", self.models, get),
            ("/model_info", self.model_info, get),
            ("/get_model_info", self.model_info, get),
            ("/server_info", self.server_info, get),
            ("/get_server_info", self.server_info, get),
            ("/flush_cache", self.flush_cache, ["GET", "POST"]),
            ("/abort_request", self.abort_request, post),
            ("/v1/loads", self.loads, get),
            ("/metrics", self.metrics, get),
        ]

    @asynccontextmanager
    async def lifespan(self, _: FastAPI) -> AsyncIterator[None]:
        """Start the engine with the app, and say loudly that it is not SGLang."""
        log.warning(
            "This is an SGLang EMULATOR, not SGLang: no model runs. It models an H100 serving "
            "a 32B model (cache %d tokens, time scale %g, %s).",
            self.capacity,
            self.live.time_scale,
            self.simulator.cost_model,
        )
        await self.live.start()
        try:
            yield
        finally:
            await self.live.close()

    async def generate(self, request: Request) -> Response:
        """`/generate`: one prompt, streamed or not, with SGLang's errors."""
        body = await _body(request)
        if body is _INVALID:
            return _invalid_json()
        try:
            parsed = parse_generate_body(body)
        except ContractError as error:
            return JSONResponse({"error": str(error)}, status_code=HTTPStatus.BAD_REQUEST)
        except ValueError as error:
            streamed = isinstance(body, dict) and body.get("stream") is True
            return _error_stream(str(error)) if streamed else _bad_request(str(error))
        try:
            submitted = self._submit(parsed)
        except ValueError as error:
            return _error_stream(str(error)) if parsed.stream else _bad_request(str(error))
        except RuntimeError as error:
            return _http_error(str(error), HTTPStatus.SERVICE_UNAVAILABLE)
        if parsed.stream:
            return EventStream(_stream(submitted), on_disconnect=submitted.abort)
        return await _answer(submitted, request)

    def _submit(self, parsed: GenerateInput) -> LiveRequest:
        if parsed.input_ids is not None:
            input_ids = parsed.input_ids
        else:
            input_ids = self.book.learn(parsed.text or "")
        check_vocabulary(input_ids, VOCABULARY_SIZE)  # where SGLang's scheduler would die
        max_new_tokens = parsed.sampling.max_new_tokens
        check_context_length(
            len(input_ids), parsed.sampling.requested_max_new_tokens, self.capacity
        )
        submitted = self.live.submit(
            input_ids,
            max_new_tokens=self.capacity if max_new_tokens is None else max_new_tokens,
            rid=parsed.rid,
            priority=parsed.priority,
            stream=parsed.stream,
            sampling_seed=parsed.sampling.sampling_seed,
            stream_interval=parsed.sampling.stream_interval,
        )
        self.book.learn(submitted.completion.text())
        return submitted

    async def chat_completions(self, request: Request) -> Response:
        """`/v1/chat/completions`: messages rendered to one prompt, streamed or not."""
        return await self._openai(request, parse_chat_body)

    async def completions(self, request: Request) -> Response:
        """`/v1/completions`: one prompt, text or token ids, streamed or not."""
        return await self._openai(request, parse_completion_body)

    async def _openai(self, request: Request, parse: Callable[[Any], OpenAIRequest]) -> Response:
        body = await _body(request)
        if body is _INVALID:
            return _openai_error("The request body is not valid JSON.", None)
        try:
            parsed = parse(body)
        except OpenAIError as error:
            return _openai_error(str(error), error.param)
        sampling = SamplingOptions(
            parsed.max_new_tokens, parsed.sampling_seed, parsed.requested_max_new_tokens
        )
        # Stop strings are looked for in the text as it grows, which takes every step's output.
        stream = parsed.stream or bool(parsed.stop)
        generate = GenerateInput(
            parsed.rid, parsed.text, parsed.input_ids, sampling, stream, parsed.priority
        )
        try:
            submitted = self._submit(generate)
        except ValueError as error:
            return _openai_error(str(error), None)
        except RuntimeError as error:
            return _openai_error(str(error), None, HTTPStatus.SERVICE_UNAVAILABLE)
        shaper = Shaper(parsed, submitted.rid)
        if parsed.stream:
            return EventStream(_openai_stream(submitted, shaper), on_disconnect=submitted.abort)
        return await _openai_answer(submitted, shaper, request)

    async def tokenize(self, request: Request) -> Response:
        """`/tokenize`: a prompt, a list of prompts, or chat `messages` (in the emulator's
        fixed chat template, with the assistant turn's opening, as its chat route renders)."""
        body = await _body(request)
        prompt = body.get("prompt") if isinstance(body, dict) else None
        messages = body.get("messages") if isinstance(body, dict) else None
        if prompt is None and isinstance(messages, list):
            turns = [(m.get("role"), m.get("content")) for m in messages if isinstance(m, dict)]
            if turns and all(isinstance(r, str) and isinstance(c, str) for r, c in turns):
                prompt = render_chat(turns)  # type: ignore[arg-type]
        if isinstance(prompt, str):
            tokens = self.book.learn(prompt)
            return JSONResponse(
                {"tokens": tokens, "count": len(tokens), "max_model_len": self.capacity}
            )
        if isinstance(prompt, list) and all(isinstance(p, str) for p in prompt):
            batch = [self.book.learn(p) for p in prompt]
            counts = [len(t) for t in batch]
            return JSONResponse({"tokens": batch, "count": counts, "max_model_len": self.capacity})
        return _bad_request("The emulator tokenizes a `prompt` string or list of strings.")

    async def detokenize(self, request: Request) -> Response:
        """`/detokenize`: ids back to text, for pieces this server has seen."""
        body = await _body(request)
        tokens = body.get("tokens") if isinstance(body, dict) else None
        flat = _int_list(tokens)
        if flat is not None:
            return JSONResponse({"text": self.book.decode(flat)})
        if isinstance(tokens, list) and all(_int_list(t) is not None for t in tokens):
            return JSONResponse({"text": [self.book.decode(t) for t in tokens]})
        return _bad_request("`tokens` must be a list of token ids or of lists of them.")

    async def health(self) -> Response:
        """`/health`, `/health_generate`, `/ready`: 200 while the engine runs."""
        running = self.live.running
        return Response(status_code=HTTPStatus.OK if running else HTTPStatus.SERVICE_UNAVAILABLE)

    async def models(self) -> dict[str, Any]:
        """`/v1/models`: the one emulated model."""
        card = {
            "id": self.live.model_name,
            "object": "model",
            "created": self.started,
            "owned_by": "sglang",
            "root": self.live.model_name,
            "parent": None,
            "max_model_len": self.capacity,
        }
        return {"object": "list", "data": [card]}

    async def model_info(self) -> dict[str, Any]:
        """`/model_info`, and the vocabulary size, which SGLang 0.5.23 states nowhere (the
        auction server reads it here when an engine does state it)."""
        return {
            "vocab_size": VOCABULARY_SIZE,
            "model_path": self.live.model_name,
            "served_model_name": self.live.model_name,
            "tokenizer_path": "inference_auctions.server.engine.builtin_tokenizer",
            "is_generation": True,
            "preferred_sampling_params": None,
            "weight_version": "default",
            "has_image_understanding": False,
            "has_audio_understanding": False,
            "model_type": None,
            "architectures": None,
        }

    async def server_info(self) -> dict[str, Any]:
        """`/server_info`: SGLang's scheduling settings as emulated, and the cost model."""
        return {
            **self.live.server_info(),
            "enable_metrics": True,
            "version": _emulator_version(),
            "emulator": {
                "time_scale": self.live.time_scale,
                "cost_model": dataclasses.asdict(self.simulator.cost_model),
            },
        }

    async def flush_cache(self) -> PlainTextResponse:
        """`/flush_cache`: empties the cache only when nothing waits or runs."""
        if self.live.flush_cache():
            return PlainTextResponse("Cache flushed.\n")
        return PlainTextResponse(
            "Cache not flushed: requests are running or waiting.\n",
            status_code=HTTPStatus.BAD_REQUEST,
        )

    async def abort_request(self, request: Request) -> Response:
        """`/abort_request`: one rid, or all with `abort_all`."""
        body = await _body(request)
        if isinstance(body, dict) and body.get("abort_all"):
            for rid in self.live.active_rids():
                self.live.abort(rid)
        elif isinstance(body, dict) and isinstance(body.get("rid"), str):
            self.live.abort(body["rid"])
        return Response(status_code=HTTPStatus.OK)

    async def loads(self) -> dict[str, Any]:
        """`/v1/loads`: one rank."""
        return {
            "timestamp": datetime.now(UTC).isoformat(),
            "version": _emulator_version(),
            "accelerator": "emulated H100",
            "num_accelerators": 1,
            "loads": [self.live.loads()],
        }

    async def metrics(self) -> Response:
        """`/metrics`: the `sglang:*` series."""
        return Response(self.live.metrics.render(), media_type=CONTENT_TYPE_LATEST)


async def _stream(submitted: LiveRequest) -> AsyncIterator[bytes]:
    try:
        ended = False
        async for output in submitted.outputs():
            chunk = _sse(output)
            if output["meta_info"]["finish_reason"] is not None:
                # The last chunk and the end of the stream in one write (SGLang sends them
                # apart; a client reads events, not writes).
                chunk, ended = chunk + _DONE, True
            yield chunk
        if not ended:
            yield _DONE
    finally:
        submitted.abort()  # the client went away before the end: free the engine


@asynccontextmanager
async def _watched(request: Request, submitted: LiveRequest) -> AsyncIterator[None]:
    """While a non-streamed request runs: as SGLang does, a client that goes away while it
    waits aborts its request; and the request is always released at the end."""
    try:
        async with watch_disconnect(request.receive, submitted.abort):
            yield
    finally:
        submitted.abort()


def _abort_status(reason: dict[str, Any]) -> int:
    return int(reason.get("status_code") or HTTPStatus.INTERNAL_SERVER_ERROR)


async def _answer(submitted: LiveRequest, request: Request) -> Response:
    final: dict[str, Any] = {}
    async with _watched(request, submitted):
        async for output in submitted.outputs():
            final = output
    reason = final["meta_info"]["finish_reason"]
    if reason.get("type") == "abort":
        status = _abort_status(reason)
        if status == HTTPStatus.BAD_REQUEST:
            return _bad_request(reason["message"])
        return _http_error(reason["message"], status)
    return JSONResponse(final)


async def _progress(
    submitted: LiveRequest, stop: tuple[str, ...]
) -> AsyncIterator[tuple[str, dict[str, Any], str | None]]:
    """(the text so far, cut at a stop string; the output; the stop string matched, if one),
    ending at the first match: the caller's release of the request then stops the engine."""
    async for output in submitted.outputs():
        text, matched = stop_cut(output["text"], stop)
        yield text, output, matched
        if matched is not None:
            return


async def _openai_answer(submitted: LiveRequest, shaper: Shaper, request: Request) -> Response:
    last: tuple[str, dict[str, Any], str | None] = ("", {}, None)
    async with _watched(request, submitted):
        async for step in _progress(submitted, shaper.request.stop):
            last = step
    text, output, matched = last
    meta = output["meta_info"]
    reason = meta["finish_reason"]
    if matched is None and reason.get("type") == "abort":
        return _openai_error(reason["message"], None, _abort_status(reason))
    usage = shaper.usage(meta["prompt_tokens"], meta["completion_tokens"])
    return JSONResponse(shaper.response(text, finish_reason(reason, matched), matched, usage))


async def _openai_stream(submitted: LiveRequest, shaper: Shaper) -> AsyncIterator[bytes]:
    stop = shaper.request.stop
    sent = 0
    try:
        if shaper.request.kind == "chat":
            yield _sse(shaper.chunk("", role=True))
        async for text, output, matched in _progress(submitted, stop):
            meta = output["meta_info"]
            reason = meta["finish_reason"]
            if matched is None and reason is not None and reason.get("type") == "abort":
                error = openai_error_body(reason["message"], None, _abort_status(reason))
                yield _sse({"error": error})
                break
            done = matched is not None or reason is not None
            upto = len(text) if done else sendable(text, stop)
            delta, sent = text[sent:upto], max(sent, upto)
            if done:
                yield _sse(shaper.chunk(delta, finish_reason(reason, matched), matched))
                if shaper.request.include_usage:
                    usage = shaper.usage(meta["prompt_tokens"], meta["completion_tokens"])
                    yield _sse(shaper.usage_chunk(usage))
            elif delta:
                yield _sse(shaper.chunk(delta))
        yield _DONE
    finally:
        submitted.abort()  # a stop string matched, or the client went away: free the engine


def create_sglang_app(live: LiveSimulator, api_key: str | None = None) -> FastAPI:
    """The SGLang-compatible app around `live`, which it starts and stops with the app; with
    `api_key`, every route but the health checks wants it, as SGLang's `--api-key` does."""
    routes = _Routes(live)
    app = FastAPI(title="SGLang emulator", lifespan=routes.lifespan)
    for path, endpoint, methods in routes.table():
        app.add_api_route(path, endpoint, methods=methods)
    if api_key is not None:
        app.add_middleware(_APIKeyCheck, api_key=api_key)
    return app


class _APIKeyCheck:
    """SGLang's `--api-key` check: `Authorization: Bearer <key>` on every request but the
    health checks and metrics, else 401 `{"error": "Unauthorized"}`."""

    def __init__(self, app: ASGIApp, api_key: str) -> None:
        self.app = app
        self._expected = f"Bearer {api_key}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] != "OPTIONS":
            path: str = scope["path"]
            if not (path.startswith("/health") or path.startswith("/metrics")):
                given = dict(scope["headers"]).get(b"authorization", b"")
                if not hmac.compare_digest(given, self._expected):
                    refusal = JSONResponse({"error": "Unauthorized"}, status_code=401)
                    await refusal(scope, receive, send)
                    return
        await self.app(scope, receive, send)
