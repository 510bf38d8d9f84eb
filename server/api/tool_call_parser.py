"""Reading tool calls out of a model's answer, and writing them as OpenAI's `tool_calls`.

Two shapes, as SGLang reads them (`server.api.tool_calls` says which request gets which):

* under `required` or a named function, the answer is a JSON array of
  `{"name": ..., "parameters": {...}}` (the schema constraint made it so; a lone object is
  read as one call), as SGLang's chat route reads an answer it forced with that schema;
* under `auto`, calls written as Qwen 2.5/3 and Hermes templates ask,
  `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`, any number of them, with
  plain text before them kept as the message's content (SGLang's `qwen25` parser).

An answer that is not wholly readable is no call: an unclosed `<tool_call>`, JSON that does not
parse, a call without a name, of a function not offered, or with arguments that are not an
object. The answer then goes back as plain content, untouched, rather than as a call the model
did not make whole.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Collection
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from inference_auctions.server.api.tool_calls import ToolPlan

__all__ = [
    "CALL_OPEN",
    "ParsedCall",
    "calls_in",
    "openai_tool_calls",
    "parse_constrained",
    "parse_tagged",
    "streamable_end",
]

CALL_OPEN, _CLOSE = "<tool_call>", "</tool_call>"
_BLOCK = re.compile(re.escape(CALL_OPEN) + r"(.*?)" + re.escape(_CLOSE), re.DOTALL)


@dataclass(frozen=True)
class ParsedCall:
    """One call read from an answer: the function's name and its arguments object."""

    name: str
    arguments: dict[str, Any]


def _call(item: Any, names: Collection[str], key: str) -> ParsedCall | None:
    """`item` as a call of an offered function, its arguments under `key`; None if not one."""
    if not isinstance(item, dict):
        return None
    name, arguments = item.get("name"), item.get(key, {})
    if not isinstance(name, str) or name not in names or not isinstance(arguments, dict):
        return None
    return ParsedCall(name, arguments)


def parse_constrained(text: str, names: Collection[str]) -> list[ParsedCall] | None:
    """The calls of a `required` or named-function answer; None when it is not wholly calls
    (the constraint was cut short by `max_tokens`, say)."""
    try:
        value = json.loads(text)
    except ValueError:
        return None
    items = [value] if isinstance(value, dict) else value
    if not isinstance(items, list) or not items:
        return None
    calls = [_call(item, names, "parameters") for item in items]
    return None if None in calls else [call for call in calls if call is not None]


def parse_tagged(text: str, names: Collection[str]) -> tuple[str | None, list[ParsedCall]]:
    """An `auto` answer's content and calls: `(text, [])` unless every `<tool_call>` block in
    it is a whole call of an offered function; then the text before the first block (None
    when blank) and the calls, in order."""
    start = text.find(CALL_OPEN)
    if start < 0:
        return text, []
    calls: list[ParsedCall] = []
    end = start
    for match in _BLOCK.finditer(text, start):
        if text[end : match.start()].strip():  # prose between or after calls: not calls
            return text, []
        try:
            value = json.loads(match.group(1))
        except ValueError:
            return text, []
        # Qwen's templates write `arguments`; some Hermes fine-tunes write `parameters`.
        key = "arguments" if isinstance(value, dict) and "arguments" in value else "parameters"
        call = _call(value, names, key)
        if call is None:
            return text, []
        calls.append(call)
        end = match.end()
    if not calls or text[end:].strip():  # an unclosed block, or text after the last call
        return text, []
    content = text[:start].strip()
    return content or None, calls


def calls_in(plan: ToolPlan, text: str) -> tuple[str | None, list[ParsedCall]] | None:
    """An answer's content and calls, read as `plan`'s tool choice asks (a constrained answer
    has no content; `parallel_tool_calls: false` keeps the first call under `auto`); None
    when it is not calls."""
    names = plan.names()
    if plan.constrained:
        constrained = parse_constrained(text, names)
        return None if constrained is None else (None, constrained)
    content, calls = parse_tagged(text, names)
    if not calls:
        return None
    return content, calls if plan.parallel else calls[:1]


def streamable_end(text: str) -> int:
    """How much of an `auto` answer so far may be streamed as content before it ends: the text
    before its first `<tool_call>`, less a tail that may be the start of one, less trailing
    blanks (they may precede a call, and a call's content is stripped)."""
    end = text.find(CALL_OPEN)
    if end < 0:
        end = len(text)
        for size in range(min(len(CALL_OPEN) - 1, len(text)), 0, -1):
            if text.endswith(CALL_OPEN[:size]):
                end -= size
                break
    return len(text[:end].rstrip())


def openai_tool_calls(calls: list[ParsedCall]) -> list[dict[str, Any]]:
    """OpenAI's `tool_calls` of a message: an id each (as SGLang makes them), the arguments as
    a JSON string."""
    return [
        {
            "id": f"call_{uuid.uuid4().hex[:24]}",
            "type": "function",
            "function": {
                "name": call.name,
                "arguments": json.dumps(call.arguments, ensure_ascii=False),
            },
        }
        for call in calls
    ]
