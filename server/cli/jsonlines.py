"""Reading requests from JSON-lines files: one object per line, errors that name the line.

The offline auction (`inference-auction auction`) and user workloads of the experiments share
this: a line holds a `prompt` (text, tokenized by the default tokenizer) or `tokens` (ids),
and money fields in credits. JSON numbers are read as `Decimal`, so 0.1 stays exact until it
becomes micro-credits.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from decimal import Decimal
from typing import Any

from inference_auctions.billing import InvalidAmount, parse_credits
from inference_auctions.server.engine.builtin_tokenizer import encode


class RecordError(ValueError):
    """A line is malformed; the message starts with `file:line` and names the field."""


def read_records(lines: Iterable[str], name: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """Each non-blank line's `file:line` and its JSON object."""
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"{name}:{number}"
        try:
            record = json.loads(line, parse_float=Decimal)
        except json.JSONDecodeError as error:
            raise RecordError(f"{where}: not valid JSON ({error.msg})") from None
        if not isinstance(record, dict):
            raise RecordError(f"{where}: expected a JSON object per line")
        yield where, record


def record_tokens(record: dict[str, Any], where: str) -> list[int]:
    """The prompt's token ids: `prompt` through the default tokenizer, or `tokens` as given."""
    if ("prompt" in record) == ("tokens" in record):
        raise RecordError(f"{where}: give exactly one of 'prompt' (text) or 'tokens' (ids)")
    if "prompt" in record:
        if not isinstance(record["prompt"], str) or not record["prompt"]:
            raise RecordError(f"{where}: field 'prompt' must be a non-empty string")
        return encode(record["prompt"])
    tokens = record["tokens"]
    if not isinstance(tokens, list) or not all(
        isinstance(t, int) and not isinstance(t, bool) and 0 <= t < 2**63 for t in tokens
    ):
        raise RecordError(f"{where}: field 'tokens' must be a list of token ids >= 0")
    return tokens


def record_credits(record: dict[str, Any], field: str, where: str) -> int | None:
    """The money field `field` in micro-credits, or None when the line has none."""
    if field not in record:
        return None
    try:
        return parse_credits(record[field], field)
    except InvalidAmount as error:
        raise RecordError(f"{where}: {error}") from None
