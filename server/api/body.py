"""Read a request body within its limits and hand it to the decoder.

Hostile bodies are refused while reading, before they cost memory or time: a body over the
size limit (by its Content-Length, or as it streams in). A client that goes away mid-body is
logged once, at INFO: it is the client's doing, not a server fault. Decoding, the checks on
the decoded JSON and validation are `server.api.json_reader`, `server.api.schemas` and
`server.api.body_decoder`.
"""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures.process import BrokenProcessPool
from typing import Any, TypeVar

from fastapi import Request
from pydantic import BaseModel
from starlette.requests import ClientDisconnect

from inference_auctions.server.api.body_decoder import INLINE_BODY_BYTES, BodyDecoder
from inference_auctions.server.api.json_reader import BodyRefused
from inference_auctions.server.api.schemas import BodyLimits
from inference_auctions.server.errors import ClientGone, InvalidRequest, Unavailable

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
