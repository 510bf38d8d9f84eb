"""Pydantic's validation errors as one sentence a person can act on.

Pydantic names union members in its locations (`text.str`, `stop.list[str]`) and prefixes
its own wording ("Value error, ..."): neither means anything to a client, so the first error
becomes "<field>: <problem>" with the field as the client wrote it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["describe_validation_error"]

# Location parts pydantic adds for union members and wrapped validators, not body keys.
_TYPE_TAG = re.compile(
    r"^(str|int|float|bool|bytes|list|dict|tuple|set|none|decimal|url|json|literal\[.*\]|"
    r"[a-z-]+\[.*\]|constrained-[a-z]+|lax-[a-z]+|strict-[a-z]+)$"
)
_MISSING_TYPES = {"missing", "missing_argument"}


def describe_validation_error(errors: Sequence[Mapping[str, Any]]) -> tuple[str, str | None]:
    """The message and the field (dotted path) of the first error."""
    first: Mapping[str, Any] = errors[0] if errors else {"loc": (), "msg": "invalid request"}
    parts = [str(part) for part in first.get("loc", ()) if part not in ("body", "query")]
    path = [part for index, part in enumerate(parts) if index == 0 or not _TYPE_TAG.match(part)]
    param = ".".join(path) or None
    kind = first.get("type", "")
    context: Mapping[str, Any] = first.get("ctx") or {}
    if kind == "value_error" and "error" in context:
        problem = str(context["error"])
    elif kind in _MISSING_TYPES:
        problem = "this field is required"
    else:
        problem = str(first.get("msg", "invalid value"))
    if param is None:
        return problem, None
    if problem.startswith(param + " "):  # already a sentence about the field
        return problem, param
    return f"{param}: {problem}", param
