"""SGLang's OpenAI-compatible bodies, for the emulator: `/v1/chat/completions`, `/v1/completions`.

This module reads a request body into one prompt and the sampling options the emulated engine
acts on, and shapes the engine's SGLang outputs into the responses SGLang's OpenAI layer returns:
`chat.completion` / `text_completion` objects, or their `*.chunk` server-sent events ending with
`data: [DONE]`. The routes themselves, which submit through the emulator's one generation path,
are in `server.emulator.sglang_app`.

The emulator has no model, so it has no chat template either. Chat messages are rendered with
this fixed template, one block per message, then the opening of the assistant's turn:

    <|system|>
    You are terse.
    <|user|>
    Hello
    <|assistant|>

(content given as a list of parts uses its `text` parts, joined). The rendered prompt is what
`usage.prompt_tokens` counts.

What is mapped onto the engine: `max_tokens` (or `max_completion_tokens`) as `max_new_tokens`,
`seed` as the sampling seed, SGLang's `rid` and `priority` extensions; `stop` is applied to the
text as it is produced: the completion ends before the first stop string (`finish_reason`
"stop", `matched_stop` the string) and the request is aborted at the engine, as SGLang stops
decoding there. `temperature`, `top_p` and the penalties are checked and otherwise ignored
(the emulated completions are deterministic). `n` must be 1. A chat request without a token
limit stops at `DEFAULT_MAX_NEW_TOKENS` (the emulated model never emits an end of sequence, so
"until the context is full" would be thousands of tokens).

A body that breaks these rules is answered 400 with SGLang's OpenAI error object, whose `param`
names the field: `{"object": "error", "message": ..., "type": "BadRequestError", "param":
"n", "code": 400}`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any, Literal

from inference_auctions.server.engine.protocol import DEFAULT_MAX_NEW_TOKENS, render_chat

__all__ = [
    "OpenAIError",
    "OpenAIRequest",
    "Shaper",
    "finish_reason",
    "openai_error_body",
    "parse_chat_body",
    "parse_completion_body",
    "render_chat",
    "sendable",
    "stop_cut",
]

Kind = Literal["chat", "completion"]
_COMPLETION_DEFAULT_MAX_TOKENS = 16  # OpenAI's and SGLang's default for /v1/completions
_MAX_STOP_STRINGS = 4
_ROLES = ("system", "developer", "user", "assistant", "tool", "function")


class OpenAIError(ValueError):
    """A body SGLang's OpenAI layer refuses; `param` is the offending field."""

    def __init__(self, message: str, param: str | None) -> None:
        super().__init__(message)
        self.param = param


def openai_error_body(message: str, param: str | None, status: int = 400) -> dict[str, Any]:
    """SGLang's OpenAI error object (its `ErrorResponse`): `type` is the status's name."""
    kind = HTTPStatus(status).phrase.title().replace(" ", "").replace("-", "") + "Error"
    if status == HTTPStatus.BAD_REQUEST:
        kind = "BadRequestError"
    return {"object": "error", "message": message, "type": kind, "param": param, "code": status}


@dataclass(frozen=True, slots=True)
class OpenAIRequest:
    """One checked OpenAI-style request, as the emulator's engine takes it."""

    kind: Kind
    model: str
    text: str | None
    input_ids: list[int] | None
    max_new_tokens: int
    # As the client sent it: only an explicit limit is checked against the context length.
    requested_max_new_tokens: int | None
    stop: tuple[str, ...]
    stream: bool
    include_usage: bool
    sampling_seed: int | None
    rid: str | None
    priority: int | None


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _optional_int(body: Mapping[str, Any], field: str) -> int | None:
    value = body.get(field)
    if value is None:
        return None
    if not _is_int(value):
        raise OpenAIError(f"`{field}` must be an integer, got {value!r}.", field)
    result: int = value
    return result


def _check_range(body: Mapping[str, Any], field: str, low: float, high: float) -> None:
    value = body.get(field)
    if value is None:
        return
    if not _is_number(value) or not math.isfinite(value) or not low <= value <= high:
        raise OpenAIError(
            f"`{field}` must be a number in [{low:g}, {high:g}], got {value!r}.", field
        )


def _max_tokens(body: Mapping[str, Any], default: int) -> tuple[int, int | None]:
    """(the limit the engine uses, the limit as the client sent it)."""
    requested = None
    for field in ("max_completion_tokens", "max_tokens"):
        value = _optional_int(body, field)
        if value is not None:
            if value < 0:
                raise OpenAIError(f"`{field}` must be at least 0, got {value}.", field)
            requested = value if requested is None else requested
    return (default if requested is None else requested), requested


def _stop(body: Mapping[str, Any]) -> tuple[str, ...]:
    value = body.get("stop")
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,) if value else ()
    if (
        isinstance(value, list)
        and len(value) <= _MAX_STOP_STRINGS
        and all(isinstance(s, str) for s in value)
    ):
        return tuple(s for s in value if s)
    raise OpenAIError(
        f"`stop` must be a string or a list of at most {_MAX_STOP_STRINGS} strings.", "stop"
    )


def _common(
    body: Any, kind: Kind, text: str | None, input_ids: list[int] | None, default: int
) -> OpenAIRequest:
    """The checks both routes share, once the prompt has been read."""
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise OpenAIError("`model` is required and must be a string.", "model")
    n = body.get("n")
    if n is not None and n != 1:
        raise OpenAIError(f"`n` must be 1: the emulator samples one choice, got {n!r}.", "n")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise OpenAIError("`stream` must be a boolean.", "stream")
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise OpenAIError("`stream_options` must be an object.", "stream_options")
    _check_range(body, "temperature", 0.0, 2.0)
    _check_range(body, "top_p", 0.0, 1.0)
    _check_range(body, "frequency_penalty", -2.0, 2.0)
    _check_range(body, "presence_penalty", -2.0, 2.0)
    max_new_tokens, requested = _max_tokens(body, default)
    rid = body.get("rid")
    if rid is not None and not isinstance(rid, str):
        raise OpenAIError("`rid` must be a string.", "rid")
    return OpenAIRequest(
        kind=kind,
        model=model,
        text=text,
        input_ids=input_ids,
        max_new_tokens=max_new_tokens,
        requested_max_new_tokens=requested,
        stop=_stop(body),
        stream=stream,
        include_usage=bool(options and options.get("include_usage")),
        sampling_seed=_optional_int(body, "seed"),
        rid=rid,
        priority=_optional_int(body, "priority"),
    )


def _content_text(content: Any, index: int) -> str:
    field = f"messages[{index}].content"
    if content is None or isinstance(content, str):
        return content or ""
    if isinstance(content, list):
        texts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text":
                raise OpenAIError("The emulator reads only text content parts.", field)
            if not isinstance(part.get("text"), str):
                raise OpenAIError("A text content part needs a `text` string.", field)
            texts.append(part["text"])
        return "".join(texts)
    raise OpenAIError("`content` must be a string or a list of content parts.", field)


def parse_chat_body(body: Any) -> OpenAIRequest:
    """Check a `/v1/chat/completions` body; raises `OpenAIError` naming the bad field."""
    if not isinstance(body, dict):
        raise OpenAIError("The body must be a JSON object.", None)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise OpenAIError("`messages` must be a non-empty list.", "messages")
    rendered = []
    for index, message in enumerate(messages):
        if not isinstance(message, dict):
            raise OpenAIError("Each message must be an object.", f"messages[{index}]")
        role = message.get("role")
        if role not in _ROLES:
            raise OpenAIError(
                f"`role` must be one of {', '.join(_ROLES)}, got {role!r}.",
                f"messages[{index}].role",
            )
        rendered.append((str(role), _content_text(message.get("content"), index)))
    return _common(body, "chat", render_chat(rendered), None, DEFAULT_MAX_NEW_TOKENS)


def _token_list(value: Any) -> list[int] | None:
    if isinstance(value, list) and value and all(_is_int(t) and t >= 0 for t in value):
        return value
    return None


def parse_completion_body(body: Any) -> OpenAIRequest:
    """Check a `/v1/completions` body: one prompt, text or token ids."""
    if not isinstance(body, dict):
        raise OpenAIError("The body must be a JSON object.", None)
    prompt = body.get("prompt")
    # A list holding one prompt is one prompt; more is a batch, which the emulator refuses.
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]
    if isinstance(prompt, str):
        text, ids = prompt, None
    elif (ids := _token_list(prompt)) is not None:
        text = None
    else:
        raise OpenAIError(
            "`prompt` must be one string or one non-empty list of token ids (no batches).",
            "prompt",
        )
    if body.get("echo"):
        raise OpenAIError("`echo` is not supported by the emulator.", "echo")
    return _common(body, "completion", text, ids, _COMPLETION_DEFAULT_MAX_TOKENS)


def finish_reason(reason: Mapping[str, Any] | None, matched: str | None) -> str | None:
    """OpenAI's finish reason for SGLang's `meta_info.finish_reason`."""
    if matched is not None:
        return "stop"
    if reason is None:
        return None
    return "length" if reason.get("type") == "length" else "stop"


def stop_cut(text: str, stop: tuple[str, ...]) -> tuple[str, str | None]:
    """`text` up to the earliest stop string, and that string (None when none occurs)."""
    best: tuple[int, str] | None = None
    for candidate in stop:
        at = text.find(candidate)
        if at >= 0 and (best is None or at < best[0]):
            best = (at, candidate)
    if best is None:
        return text, None
    return text[: best[0]], best[1]


def sendable(text: str, stop: tuple[str, ...]) -> int:
    """How much of a growing `text` may be streamed: all but a tail that could still become
    a stop string, which must never reach the client."""
    hold = 0
    for candidate in stop:
        for size in range(min(len(candidate) - 1, len(text)), hold, -1):
            if text.endswith(candidate[:size]):
                hold = size
                break
    return len(text) - hold


class Shaper:
    """Builds one request's OpenAI responses (whole, or as chunks) from SGLang outputs."""

    def __init__(self, request: OpenAIRequest, rid: str) -> None:
        self.request = request
        self.id = rid
        self.created = int(time.time())
        chat = request.kind == "chat"
        self.object = "chat.completion" if chat else "text_completion"
        self.chunk_object = "chat.completion.chunk" if chat else "text_completion"

    def usage(self, prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
        """SGLang's `usage` object."""
        return {
            "prompt_tokens": prompt_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "completion_tokens": completion_tokens,
            "prompt_tokens_details": None,
            "reasoning_tokens": 0,
        }

    def response(
        self, text: str, reason: str | None, matched: str | None, usage: dict[str, Any]
    ) -> dict[str, Any]:
        """The whole (non-streamed) response."""
        choice: dict[str, Any] = {"index": 0}
        if self.request.kind == "chat":
            choice["message"] = {
                "role": "assistant",
                "content": text,
                "reasoning_content": None,
                "tool_calls": None,
            }
        else:
            choice["text"] = text
        choice.update(logprobs=None, finish_reason=reason, matched_stop=matched)
        return {**self._head(self.object), "choices": [choice], "usage": usage}

    def chunk(
        self,
        delta: str,
        reason: str | None = None,
        matched: str | None = None,
        *,
        role: bool = False,
    ) -> dict[str, Any]:
        """One streamed chunk: `delta` text; `role` opens a chat answer as SGLang does."""
        choice: dict[str, Any] = {"index": 0}
        if self.request.kind == "chat":
            choice["delta"] = (
                {"role": "assistant", "content": delta} if role else {"content": delta}
            )
        else:
            choice["text"] = delta
        choice.update(logprobs=None, finish_reason=reason)
        if reason is not None:
            choice["matched_stop"] = matched
        return {**self._head(self.chunk_object), "choices": [choice], "usage": None}

    def usage_chunk(self, usage: dict[str, Any]) -> dict[str, Any]:
        """The last chunk when `stream_options.include_usage` asks for it."""
        return {**self._head(self.chunk_object), "choices": [], "usage": usage}

    def _head(self, kind: str) -> dict[str, Any]:
        return {"id": self.id, "object": kind, "created": self.created, "model": self.request.model}
