"""Read a JSON request body exactly: numbers with a fraction become `Decimal`, never float.

A bid of 0.1 credits must be 100,000 micro-credits, not the nearest binary float; NaN and
Infinity (which Python's json accepts) come through as non-finite Decimals for the money
parser to refuse by name.

Hostile bodies are refused while reading, before they cost memory or time: a body over the
size limit (by its Content-Length, or as it streams in), a number too long or too far out of
range to mean anything here (exact parsing of `1e999999999` would expand a billion digits),
and a string holding an unpaired UTF-16 surrogate (`"\\ud800"`: valid JSON, but not Unicode,
so no tokenizer or engine can encode it).
"""

from __future__ import annotations

import json
import re
from decimal import Decimal
from typing import Any, TypeVar

from fastapi import Request
from pydantic import BaseModel, ValidationError

from server.api.error_handlers import validation_to_invalid_request
from server.errors import InvalidRequest

Model = TypeVar("Model", bound=BaseModel)

MAX_BODY_BYTES = 16 * 1024 * 1024
# No field takes a number longer than this or beyond this decimal exponent (floats end near
# 1e308, money at 1e9 credits).
MAX_NUMBER_CHARS = 100
MAX_NUMBER_EXPONENT = 400
# The JSON escape of a surrogate, \uD800 to \uDFFF: paired (an emoji) or not. Only a body
# with one, or with non-ASCII bytes (Python's JSON decoder lets encoded surrogates through),
# needs the slower check for unpaired ones.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


def _too_large(size: int | str) -> InvalidRequest:
    shown = f"{size:,}" if isinstance(size, int) else size[:24]
    return InvalidRequest(f"the body is {shown} bytes; the limit is {MAX_BODY_BYTES:,}")


def _out_of_range(text: str) -> InvalidRequest:
    shown = text if len(text) <= 24 else text[:24] + "..."
    return InvalidRequest(f"the body has a number out of range: {shown}")


def _integer(text: str) -> int:
    if len(text) > MAX_NUMBER_CHARS:
        raise _out_of_range(text)
    return int(text)


def _decimal(text: str) -> Decimal:
    if len(text) > MAX_NUMBER_CHARS:
        raise _out_of_range(text)
    value = Decimal(text)
    if abs(value.adjusted()) > MAX_NUMBER_EXPONENT:
        raise _out_of_range(text)
    return value


async def _read_body(request: Request) -> bytes:
    declared = request.headers.get("content-length", "")
    # A declared size over the limit is refused before a byte is read (9 digits are over it).
    digits = declared.isascii() and declared.isdigit()
    if digits and (len(declared) > 9 or int(declared) > MAX_BODY_BYTES):
        raise _too_large(declared)
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise _too_large(size)
        chunks.append(chunk)
    return b"".join(chunks)


async def read_json(request: Request) -> Any:
    """Parse the body as JSON with exact decimals; 400 with the reason when it is not."""
    body = await _read_body(request)
    try:
        data = json.loads(body, parse_float=_decimal, parse_int=_integer, parse_constant=Decimal)
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise InvalidRequest(f"the body is not valid JSON: {error}") from None
    except RecursionError:
        raise InvalidRequest("the body is nested too deeply") from None
    if not body.isascii() or _SURROGATE_ESCAPE.search(body):
        try:
            json.dumps(data, ensure_ascii=False, default=str).encode()
        except UnicodeEncodeError:
            raise InvalidRequest(
                "the body has a string with an unpaired surrogate (\\ud800-\\udfff): "
                "not valid Unicode"
            ) from None
    return data


async def parse_body(request: Request, model: type[Model]) -> Model:
    """Read and validate the body as `model`; a 400 names the first bad field."""
    data = await read_json(request)
    if not isinstance(data, dict):
        raise InvalidRequest("the body must be a JSON object")
    try:
        return model.model_validate(data)
    except ValidationError as error:
        raise validation_to_invalid_request(error.errors()) from None


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
