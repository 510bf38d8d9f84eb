"""Read a JSON request body exactly: numbers with a fraction become `Decimal`, never float.

A bid of 0.1 credits must be 100,000 micro-credits, not the nearest binary float; NaN and
Infinity (which Python's json accepts) come through as non-finite Decimals for the money
parser to refuse by name.
"""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any, TypeVar

from fastapi import Request
from pydantic import BaseModel, ValidationError

from server.api.error_handlers import validation_to_invalid_request
from server.errors import InvalidRequest

Model = TypeVar("Model", bound=BaseModel)

MAX_BODY_BYTES = 16 * 1024 * 1024


async def read_json(request: Request) -> Any:
    """Parse the body as JSON with exact decimals; 400 with the reason when it is not."""
    body = await request.body()
    if len(body) > MAX_BODY_BYTES:
        raise InvalidRequest(f"the body is {len(body):,} bytes; the limit is {MAX_BODY_BYTES:,}")
    try:
        return json.loads(body, parse_float=Decimal, parse_constant=Decimal)
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise InvalidRequest(f"the body is not valid JSON: {error}") from None
    except RecursionError:
        raise InvalidRequest("the body is nested too deeply") from None


async def parse_body(request: Request, model: type[Model]) -> Model:
    """Read and validate the body as `model`; a 400 names the first bad field."""
    data = await read_json(request)
    if not isinstance(data, dict):
        raise InvalidRequest("the body must be a JSON object")
    try:
        return model.model_validate(data)
    except ValidationError as error:
        raise validation_to_invalid_request(error.errors()) from None
