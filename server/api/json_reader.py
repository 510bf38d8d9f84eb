"""Decode a JSON body exactly and safely: no float, no deep nesting, no invalid Unicode.

Numbers with a fraction become `Decimal`, never float: a bid of 0.1 credits must be 100,000
micro-credits, not the nearest binary float; NaN and Infinity (which Python's json accepts)
come through as non-finite Decimals for the money parser to refuse by name.

Refused before they cost anything: nesting deeper than the limit (measured on the raw bytes,
before any recursive walk: a body nested 500 deep would otherwise overflow the first Python
function that walks it), a number too long or too far out of range to mean anything here
(exact parsing of `1e999999999` would expand a billion digits), and a string holding an
unpaired UTF-16 surrogate (`"\\ud800"`: valid JSON, but not Unicode, so no tokenizer or engine
can encode it).

Nothing here imports the web stack: large bodies are decoded in worker processes.
"""

from __future__ import annotations

import json
import re
from decimal import Decimal
from itertools import accumulate
from typing import Any

import numpy as np

__all__ = ["BodyRefused", "decode_json", "json_depth"]

# No field takes a number longer than this or beyond this decimal exponent (floats end near
# 1e308, money at 1e9 credits).
MAX_NUMBER_CHARS = 100
MAX_NUMBER_EXPONENT = 400
# The JSON escape of a surrogate, \uD800 to \uDFFF: paired (an emoji) or not. Only a body
# with one, or with non-ASCII bytes (Python's JSON decoder lets encoded surrogates through),
# needs the slower check for unpaired ones.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
# A JSON string, escapes included; written as an unrolled loop so that long strings are
# matched at C speed without backtracking.
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_NOT_BRACKETS = bytes(set(range(256)) - set(b"[]{}"))
_BRACKET_STEP = np.zeros(256, dtype=np.int8)
_BRACKET_STEP[list(b"[{")] = 1
_BRACKET_STEP[list(b"]}")] = -1
_BRACKET_STEPS: list[int] = _BRACKET_STEP.tolist()
# Up to this many brackets, a Python loop is faster than numpy's vectorised walk.
_FEW_BRACKETS = 64


class BodyRefused(ValueError):
    """The body cannot be accepted: `message` says why, `param` names the field if any."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message, param)  # both in args, so the error survives pickling
        self.message = message
        self.param = param

    def __str__(self) -> str:
        return self.message


def json_depth(body: bytes) -> int:
    """How deeply the arrays and objects of `body` nest (brackets inside strings ignored)."""
    brackets = _STRING.sub(b"", body).translate(None, _NOT_BRACKETS)
    if not brackets:
        return 0
    if len(brackets) <= _FEW_BRACKETS:  # a usual body: numpy's fixed cost would dominate
        return max(accumulate(_BRACKET_STEPS[bracket] for bracket in brackets))
    steps = _BRACKET_STEP[np.frombuffer(brackets, dtype=np.uint8)]
    return int(np.cumsum(steps, dtype=np.int64).max())


def _out_of_range(text: str) -> BodyRefused:
    shown = text if len(text) <= 24 else text[:24] + "..."
    return BodyRefused(f"the body has a number out of range: {shown}")


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


# `json.loads` with these hooks would build a decoder (and its scanner) on every call.
_DECODER = json.JSONDecoder(parse_float=_decimal, parse_int=_integer, parse_constant=Decimal)


def decode_json(body: bytes, max_depth: int) -> Any:
    """Parse `body` with exact decimals; `BodyRefused` with the reason when it cannot be."""
    if json_depth(body) > max_depth:
        raise BodyRefused(f"the body is nested too deeply: the limit is {max_depth} levels")
    try:
        # As `json.loads(body, ...)` does with bytes, but with one decoder for every body.
        data = _DECODER.decode(body.decode(json.detect_encoding(body), "surrogatepass"))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise BodyRefused(f"the body is not valid JSON: {error}") from None
    except RecursionError:  # only if the limit is set above what the decoder can nest
        raise BodyRefused("the body is nested too deeply") from None
    if not body.isascii() or _SURROGATE_ESCAPE.search(body):
        try:
            json.dumps(data, ensure_ascii=False, default=str).encode()
        except UnicodeEncodeError:
            raise BodyRefused(
                "the body has a string with an unpaired surrogate (\\ud800-\\udfff): "
                "not valid Unicode"
            ) from None
    return data
