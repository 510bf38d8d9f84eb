"""JSON answers serialized by orjson: several times faster than the standard library's encoder,
and these bodies are written once per request (and once per streamed chunk) on the hot path."""

from __future__ import annotations

from typing import Any

import orjson
from starlette.responses import Response

__all__ = ["JSONBytes", "sse_event"]


class JSONBytes(Response):
    """`application/json`, rendered by orjson (UTF-8, compact, like Starlette's JSONResponse)."""

    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return orjson.dumps(content)


def sse_event(data: Any) -> bytes:
    """One server-sent event carrying `data` as JSON."""
    return b"data: " + orjson.dumps(data) + b"\n\n"
