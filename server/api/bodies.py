"""Reading a request body within its limits, and decoding it: at once, or in a worker process.

Hostile bodies are refused while reading, before they cost memory or time: a body over the
size limit (by its Content-Length, or as it streams in). A client that goes away mid-body is
logged once, at INFO: it is the client's doing, not a server fault. Decoding, the checks on
the decoded JSON and validation are `server.api.schemas` (`decode_json`, `check_raw`) and
`validate_body` below.

Decode and validate request bodies: small ones at once, large ones in worker processes.

JSON decoding and validation are CPU-bound and hold the GIL: on the event loop (or in a thread)
a 10 MB body stalls every other request for as long as it takes. Bodies above
`INLINE_BODY_BYTES` are therefore decoded in a small pool of worker processes, at a lower CPU
priority, which send back only the validated model (or the reason it was refused): a
hostile body then costs its sender time, not the other users'.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import logging
import multiprocessing
import os
from collections.abc import Mapping
from concurrent.futures.process import BrokenProcessPool
from typing import Any, TypeVar

from fastapi import Request
from pydantic import BaseModel, ValidationError
from starlette.requests import ClientDisconnect

from inference_auctions.server.api.schemas import (
    BodyLimits,
    BodyRefused,
    RequestBody,
    decode_json,
    describe_validation_error,
    json_depth,
)
from inference_auctions.server.errors import ClientGone, InvalidRequest, Unavailable

__all__ = [
    "INLINE_BODY_BYTES",
    "MAX_BODY_BYTES",
    "BodyDecoder",
    "json_body_schema",
    "parse_body",
    "validate_body",
]

Model = TypeVar("Model", bound=BaseModel)

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 16 * 1024 * 1024


def _too_large(size: int | str) -> InvalidRequest:
    shown = f"{size:,}" if isinstance(size, int) else size[:24]
    return InvalidRequest(f"the body is {shown} bytes; the limit is {MAX_BODY_BYTES:,}")


async def _read_body(request: Request) -> bytes:
    declared = request.headers.get("content-length", "")
    # A declared size over the limit is refused before a byte is read (9 digits are over it).
    digits = declared.isascii() and declared.isdigit()
    if digits and (len(declared) > 9 or int(declared) > MAX_BODY_BYTES):
        raise _too_large(declared)
    chunks: list[bytes] = []
    size = 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > MAX_BODY_BYTES:
                raise _too_large(size)
            chunks.append(chunk)
    except ClientDisconnect:
        log.info(
            "%s disconnected after %s of its %s body bytes (%s %s)",
            _client(request),
            f"{size:,}",
            declared or "undeclared",
            request.method,
            request.url.path,
        )
        raise ClientGone("the client disconnected before sending its whole body") from None
    return b"".join(chunks)


def body_limits(request: Request) -> BodyLimits:
    """The body limits of the app serving `request` (the defaults before it has started)."""
    services = getattr(request.app.state, "services", None)
    if services is None:
        return BodyLimits()
    return BodyLimits.from_settings(services.settings)


def _decoder(request: Request) -> BodyDecoder:
    decoder = getattr(request.app.state, "body_decoder", None)
    if decoder is None:
        decoder = request.app.state.body_decoder = BodyDecoder()
    assert isinstance(decoder, BodyDecoder)
    return decoder


async def parse_body(request: Request, model: type[Model]) -> Model:
    """Read and validate the body as `model`; a 400 names the first bad field."""
    body = await _read_body(request)
    try:
        decoding = _decoder(request).validate(body, model, body_limits(request))
        if len(body) <= INLINE_BODY_BYTES:
            return await decoding
        return await _unless_gone(request, asyncio.ensure_future(decoding))
    except BodyRefused as error:
        raise InvalidRequest(error.message, param=error.param) from None
    except BrokenProcessPool:
        raise Unavailable("the server could not decode the body; retry shortly") from None


async def _unless_gone(request: Request, decoding: asyncio.Future[Model]) -> Model:
    """The decoded body, or `ClientGone` as soon as the client leaves: its body then waits
    for no worker (and a request that nobody reads holds up no shutdown)."""
    gone = asyncio.ensure_future(_disconnected(request))
    either: set[asyncio.Future[Any]] = {decoding, gone}
    try:
        await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
    if not decoding.done():
        decoding.cancel()
        log.info("%s left while its body was being decoded", _client(request))
        raise ClientGone("the client disconnected while its body was being decoded")
    return decoding.result()


async def _disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


def _client(request: Request) -> str:
    client = request.client
    return f"{client.host}:{client.port}" if client else "a client"


def json_body_schema(model: type[BaseModel]) -> dict[str, Any]:
    """`openapi_extra` publishing `model` as the required JSON body of a route that reads its
    body itself. Pydantic's `$defs` are inlined: inside an OpenAPI document a `#/$defs/...`
    reference points at the document's root, where there is nothing, and clients that resolve
    it (code generators, schema-driven fuzzers) fail or drop the body."""
    schema = model.model_json_schema()
    defs = schema.pop("$defs", {})

    def inline(node: Any) -> Any:
        if isinstance(node, list):
            return [inline(item) for item in node]
        if not isinstance(node, dict):
            return node
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/$defs/"):
            rest = {key: value for key, value in node.items() if key != "$ref"}
            return {**inline(defs[ref.removeprefix("#/$defs/")]), **inline(rest)}
        return {key: inline(value) for key, value in node.items()}

    content = {"application/json": {"schema": inline(schema)}}
    return {"requestBody": {"required": True, "content": content}}


# Up to this size a body is decoded on the event loop: a few milliseconds at most, about what
# a hand-off to another process costs.
INLINE_BODY_BYTES = 64 * 1024
_WORKERS = 2
_WORKER_NICENESS = 10


def validate_body(body: bytes, model: type[Model], limits: BodyLimits) -> Model:
    """The body as `model`, or `BodyRefused` saying what is wrong with it."""
    if len(body) > INLINE_BODY_BYTES:
        _refuse_early(body, model, limits)
    data = decode_json(body, limits.max_json_depth)
    if not isinstance(data, Mapping):
        raise BodyRefused("the body must be a JSON object")
    if issubclass(model, RequestBody):
        model.check_raw(data, limits)
    try:
        return model.model_validate(data)
    except ValidationError as error:
        raise BodyRefused(*describe_validation_error(error.errors())) from None


def _refuse_early(body: bytes, model: type[BaseModel], limits: BodyLimits) -> None:
    """The size limits on a quick parse (floats in C, not exact decimals in Python): a large
    hostile body costs a tenth of the exact parse; one that passes gets the exact one."""
    if not issubclass(model, RequestBody) or json_depth(body) > limits.max_json_depth:
        return
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):
        return  # the exact parse says what is wrong
    if isinstance(data, Mapping):
        model.check_raw(data, limits)


def _lower_priority() -> None:
    os.nice(_WORKER_NICENESS)


def _ready() -> None:
    """A first job for each worker, so that it has imported this module before real work."""


class BodyDecoder:
    """Owns the worker processes (started on the first large body) of one app."""

    def __init__(self, workers: int = _WORKERS) -> None:
        self._workers = workers
        self._pool: concurrent.futures.ProcessPoolExecutor | None = None
        self._starting = asyncio.Lock()

    def _start_pool(self) -> concurrent.futures.ProcessPoolExecutor:
        # forkserver: forking this process, which runs threads, would be unsafe.
        context = multiprocessing.get_context("forkserver")
        pool = concurrent.futures.ProcessPoolExecutor(
            self._workers, mp_context=context, initializer=_lower_priority
        )
        # Each submit to a pool without an idle worker starts one, in the submitting thread;
        # here, so that the event loop never waits for a process to start.
        for started in [pool.submit(_ready) for _ in range(self._workers)]:
            started.result()
        return pool

    async def _executor(self) -> concurrent.futures.ProcessPoolExecutor:
        async with self._starting:
            if self._pool is None:
                self._pool = await asyncio.to_thread(self._start_pool)
            return self._pool

    async def validate(self, body: bytes, model: type[Model], limits: BodyLimits) -> Model:
        """`validate_body`, off the event loop when the body is large."""
        if len(body) <= INLINE_BODY_BYTES:
            return validate_body(body, model, limits)
        pool = await self._executor()
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.run_in_executor(pool, validate_body, body, model, limits)
        try:
            result: Model = await future
        except BrokenProcessPool:
            self._pool = None  # a worker died (killed for memory?): the next body gets new ones
            raise
        return result

    def close(self) -> None:
        """Stop the workers; bodies still being decoded are dropped."""
        if self._pool is not None:
            workers = list(self._pool._processes.values())
            self._pool.shutdown(wait=False, cancel_futures=True)
            # A worker busy with a hostile body would hold up the process's exit until done.
            for worker in workers:
                worker.terminate()
            self._pool = None
