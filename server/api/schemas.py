"""Request bodies of the generation endpoints: their schemas, exact JSON, and clear refusals.

Each body is checked in two steps: `check_raw` on the decoded JSON (cheap, bounded checks that
must come before pydantic walks it: typos of top-level keys, per-field size limits), then the
pydantic model.

Unknown top-level keys are refused by name, without refusing the keys SGLang's clients add.

A key the server does not read would serve the request differently from what was asked: a bid
sent as `bid_micros` (the answer's name), `value` (the SDK's parameter), `max_bid` or
`priority` would be served at bid 0. So every top-level key is either a field of the body, one
of the keys the route accepts by design (`ACCEPTED_KEYS`: on `/generate`, SGLang's own request
keys and those routers add, which SGLang ignores too; on the OpenAI routes, OpenAI's labels
such as `user`), or a 400 that names it, with a hint where one fits: `bid` for a bid under
another name, the field a slip away from it (`bdi`, `Bid`, `sampling_param`).

Pydantic's validation errors as one sentence a person can act on.

Pydantic names union members in its locations (`text.str`, `stop.list[str]`) and prefixes
its own wording ("Value error, ..."): neither means anything to a client, so the first error
becomes "<field>: <problem>" with the field as the client wrote it.

Decode a JSON body exactly and safely: no float, no deep nesting, no invalid Unicode.

Numbers with a fraction become `Decimal`, never float: a bid of 0.1 credits must be 100,000
micro-credits, not the nearest binary float; NaN and Infinity (which Python's json accepts)
come through as non-finite Decimals for the money parser to refuse by name.

Refused before they cost anything: nesting deeper than the limit (measured on the raw bytes,
before any recursive walk: a body nested 500 deep would otherwise overflow the first Python
function that walks it), a number too long or too far out of range to mean anything here
(exact parsing of `1e999999999` would expand a billion digits), and a string holding an
unpaired UTF-16 surrogate (`"\ud800"`: valid JSON, but not Unicode, so no tokenizer or engine
can encode it).

Nothing here imports the web stack: large bodies are decoded in worker processes.
"""

from __future__ import annotations

import functools
import json
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from itertools import accumulate
from typing import Annotated, Any, ClassVar, Literal, Protocol

import numpy as np
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictInt,
    StringConstraints,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from inference_auctions.server.api.openai_fields import (
    LABELS,
    REFUSED,
    SGLANG_SAMPLING_EXTRAS,
    json_schema_of,
    refused_field,
)
from inference_auctions.server.api.tool_calls import (
    MessageToolCall,
    NamedToolChoice,
    ToolPlan,
    ToolSpec,
    arguments_object,
    tool_plan,
)

__all__ = [
    "RID_MAX_LENGTH",
    "SGLANG_TOP_LEVEL_KEYS",
    "BodyLimits",
    "BodyRefused",
    "ChatBody",
    "ChatMessage",
    "CompletionBody",
    "GenerateBody",
    "OpenAIBody",
    "RequestBody",
    "SamplingParams",
    "TextPart",
    "UnknownField",
    "check_top_level_keys",
    "decode_json",
    "describe_validation_error",
    "json_depth",
    "near_miss",
]

# A rid is the client's idempotency key; it also reaches the ledger and the engine. The ledger
# keys a request as "<user>/<rid>" in 128 characters and a user name takes up to 64, so 63
# leave room for every user: the limit is the same whoever sends the rid.
RID_MAX_LENGTH = 63
RequestId = Annotated[
    str,
    StringConstraints(min_length=1, max_length=RID_MAX_LENGTH, pattern=r"^[A-Za-z0-9._:@+=-]+$"),
]
TokenId = Annotated[StrictInt, Field(ge=0, lt=2**31)]
FiniteFloat = Annotated[float, Field(allow_inf_nan=False)]


class _BodySettings(Protocol):
    max_json_depth: int
    max_logit_bias_entries: int
    max_custom_params_bytes: int


@dataclass(frozen=True)
class BodyLimits:
    """The size limits a body is checked against before validation (server settings)."""

    max_json_depth: int = 32
    max_logit_bias_entries: int = 4_096
    max_custom_params_bytes: int = 65_536

    @classmethod
    def from_settings(cls, settings: _BodySettings) -> BodyLimits:
        """The limits the server is configured with."""
        return cls(
            settings.max_json_depth,
            settings.max_logit_bias_entries,
            settings.max_custom_params_bytes,
        )


def _engine_json(value: Any) -> Any:
    """Free-form JSON as the engine's JSON encoder can send it: the exact reader's decimals
    become floats, and a non-finite number (which no JSON encoder sends) is refused."""
    if isinstance(value, Decimal):
        number = float(value)
        if not math.isfinite(number):
            raise ValueError(f"numbers must be finite floats, got {value}")
        return number
    if isinstance(value, list):
        return [_engine_json(item) for item in value]
    if isinstance(value, dict):
        return {key: _engine_json(item) for key, item in value.items()}
    return value


def check_sampling_limits(params: Mapping[str, Any], limits: BodyLimits, prefix: str) -> None:
    """Refuse a `logit_bias` or `custom_params` over its size limit, before it is validated."""
    bias = params.get("logit_bias")
    if isinstance(bias, dict) and len(bias) > limits.max_logit_bias_entries:
        raise BodyRefused(
            f"{prefix}logit_bias: {len(bias):,} entries; the limit is "
            f"{limits.max_logit_bias_entries:,}",
            param=f"{prefix}logit_bias",
        )
    custom = params.get("custom_params")
    if custom is not None:
        size = len(json.dumps(custom, default=str, separators=(",", ":")).encode())
        if size > limits.max_custom_params_bytes:
            raise BodyRefused(
                f"{prefix}custom_params: {size:,} bytes of JSON; the limit is "
                f"{limits.max_custom_params_bytes:,}",
                param=f"{prefix}custom_params",
            )


@functools.cache
def _field_names(model: type[BaseModel]) -> tuple[str, ...]:
    """The model's field names, in order, read once: pydantic's `model_fields` is a class
    property that costs more on every read than the checks that use it."""
    return tuple(model.model_fields)


@functools.cache
def _field_set(model: type[BaseModel]) -> frozenset[str]:
    """`_field_names` as a set, for membership tests on bodies of many keys."""
    return frozenset(_field_names(model))


class RequestBody(BaseModel):
    """A generation body: a top-level key that is neither a field nor one of `ACCEPTED_KEYS`
    is refused by name (see the module docstring)."""

    model_config = ConfigDict(extra="ignore")

    # Keys that are not fields but that the route accepts, and ignores, by design.
    ACCEPTED_KEYS: ClassVar[frozenset[str]] = frozenset()

    @classmethod
    def check_raw(cls, data: Mapping[str, Any], limits: BodyLimits) -> None:
        """Checks on the decoded JSON, before validation; `BodyRefused` names the field."""
        try:
            check_top_level_keys(data, _field_names(cls), cls.ACCEPTED_KEYS)
        except UnknownField as error:
            raise BodyRefused(str(error), param=error.key) from None


# OpenAI's names of SGLang's sampling parameters, which `sampling_params` does not take.
OPENAI_SAMPLING_NAMES = {
    "max_tokens": "max_new_tokens",
    "max_completion_tokens": "max_new_tokens",
    "min_tokens": "min_new_tokens",
    "seed": "sampling_seed",
}
_KEYS_EXAMINED = 200  # so that a body of a million keys costs no more


class SamplingParams(BaseModel):
    """SGLang 0.5.23's 27 sampling parameters, checked as SGLang checks them: an unknown key is
    a 400, `null` means the default, and the values SGLang's `verify` refuses are refused."""

    model_config = ConfigDict(extra="forbid")

    max_new_tokens: StrictInt = Field(default=128, ge=0)
    min_new_tokens: StrictInt = Field(default=0, ge=0)
    temperature: float = Field(default=1.0, ge=0, allow_inf_nan=False)
    top_p: float = Field(default=1.0, gt=0, le=1, allow_inf_nan=False)
    top_k: StrictInt = Field(default=-1, ge=-1)
    min_p: float = Field(default=0.0, ge=0, le=1, allow_inf_nan=False)
    frequency_penalty: float = Field(default=0.0, ge=-2, le=2, allow_inf_nan=False)
    presence_penalty: float = Field(default=0.0, ge=-2, le=2, allow_inf_nan=False)
    repetition_penalty: float = Field(default=1.0, gt=0, le=2, allow_inf_nan=False)
    stop: str | list[str] | None = None
    stop_token_ids: list[TokenId] | None = None
    stop_regex: str | list[str] | None = None
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    no_stop_trim: bool = False
    n: Literal[1] = 1
    beam_width: StrictInt | None = None
    regex: str | None = None
    json_schema: str | None = None
    ebnf: str | None = None
    structural_tag: str | None = None
    stream_interval: StrictInt | None = Field(default=None, ge=1)
    sampling_seed: StrictInt | None = None
    logit_bias: dict[str, FiniteFloat] | None = None
    custom_params: dict[str, Any] | None = None
    watermark: dict[str, Any] | None = None

    @model_validator(mode="before")
    @classmethod
    def _suggest(cls, data: Any) -> Any:
        # An unknown parameter stays a 400, as in SGLang; one that is the OpenAI name of one
        # of SGLang's (`max_tokens`) or a slip away from one says which was meant.
        if isinstance(data, dict):
            fields = _field_set(cls)
            for key in list(data)[:_KEYS_EXAMINED]:
                if not isinstance(key, str) or key in fields:
                    continue
                meant = OPENAI_SAMPLING_NAMES.get(key) or near_miss(key, sorted(fields))
                if meant is not None:
                    raise ValueError(f"unknown sampling parameter {key!r}; did you mean {meant!r}?")
        return data

    @model_validator(mode="before")
    @classmethod
    def _null_is_default(cls, data: Any) -> Any:
        # SGLang reads a null parameter as its default; its own frontend sends nulls.
        if isinstance(data, dict):  # an unknown key stays, to be refused even when null
            fields = _field_set(cls)
            return {k: v for k, v in data.items() if v is not None or k not in fields}
        return data

    @field_validator("top_k")
    @classmethod
    def _top_k(cls, value: int) -> int:
        if value == 0:
            raise ValueError("top_k must be -1 (disable) or at least 1, got 0")
        return value

    @field_validator("logit_bias")
    @classmethod
    def _token_keys(cls, value: dict[str, float] | None) -> dict[str, float] | None:
        for key in value or {}:
            if not (key.isascii() and key.isdigit()) or len(key) > 10:
                raise ValueError(f"logit_bias keys must be token ids (0, 1, ...), got {key[:24]!r}")
        return value

    @field_validator("custom_params", "watermark")
    @classmethod
    def _sendable(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        return None if value is None else _engine_json(value)

    @model_validator(mode="after")
    def _consistent(self) -> SamplingParams:
        if self.min_new_tokens > self.max_new_tokens:
            raise ValueError(
                f"min_new_tokens must be in [0, max_new_tokens ({self.max_new_tokens})], "
                f"got {self.min_new_tokens}"
            )
        grammars = [name for name in ("json_schema", "regex", "ebnf") if getattr(self, name)]
        if len(grammars) > 1:
            raise ValueError("only one of regex, json_schema or ebnf can be set")
        return self

    def for_engine(self) -> dict[str, Any]:
        """Only what the client set, so the engine keeps its own defaults for the rest."""
        return self.model_dump(exclude_unset=True)


class GenerateBody(RequestBody):
    """`POST /generate`: SGLang's request plus `bid` (credits; number or decimal string)."""

    text: str | list[str] | None = None
    input_ids: list[TokenId] | None = None
    sampling_params: SamplingParams = Field(default_factory=SamplingParams)
    rid: RequestId | None = None
    stream: bool = False
    # Log probabilities, as SGLang's (`server.api.logprobs`: a real SGLang computes them).
    return_logprob: bool = False
    logprob_start_len: StrictInt | None = Field(default=None, ge=-1)
    top_logprobs_num: StrictInt | None = Field(default=None, ge=0, le=20)
    token_ids_logprob: list[TokenId] | None = Field(default=None, max_length=256)
    return_text_in_logprobs: bool = False
    bid: Any = Field(
        default="0", description="Credits: a JSON number or a decimal string; none means 0"
    )
    service_tier: Any = Field(
        default=None,
        description="Under `--pricing tiers`: the tier's name (none or `auto`: the default tier)",
    )

    @classmethod
    def check_raw(cls, data: Mapping[str, Any], limits: BodyLimits) -> None:
        """Near-miss keys, then the sampling size limits."""
        super().check_raw(data, limits)
        params = data.get("sampling_params")
        if isinstance(params, dict):
            check_sampling_limits(params, limits, "sampling_params.")

    @field_validator("text", mode="before")
    @classmethod
    def _text(cls, value: Any) -> Any:
        if value is None or isinstance(value, str):
            return value
        if isinstance(value, list) and all(isinstance(item, str) for item in value):
            return value
        raise ValueError("text must be a string or a list of strings")

    @field_validator("sampling_params", mode="before")
    @classmethod
    def _params_default(cls, value: Any) -> Any:
        return {} if value is None else value


class OpenAIBody(RequestBody):
    """What the OpenAI routes share: OpenAI's sampling fields, SGLang's extra ones, and the
    refusal by name of the fields not served (`server.api.openai_fields`)."""

    # OpenAI's labels; the fields refused by name are checked in `check_raw` before these.
    ACCEPTED_KEYS = LABELS | REFUSED.keys()

    model: str | None = None
    temperature: float = Field(default=1.0, ge=0, le=2, allow_inf_nan=False)
    top_p: float = Field(default=1.0, gt=0, le=1, allow_inf_nan=False)
    stop: str | list[str] | None = None
    n: Literal[1] = 1
    stream: bool = False
    seed: StrictInt | None = None
    presence_penalty: float | None = Field(default=None, ge=-2, le=2, allow_inf_nan=False)
    frequency_penalty: float | None = Field(default=None, ge=-2, le=2, allow_inf_nan=False)
    # OpenAI's: token id (a string) -> -100..100, added to its logit (SGLang's `logit_bias`).
    logit_bias: dict[str, FiniteFloat] | None = None
    # SGLang's own sampling fields, which its OpenAI routes take too.
    top_k: StrictInt | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    min_tokens: StrictInt | None = None
    stop_token_ids: list[TokenId] | None = None
    ignore_eos: bool | None = None
    skip_special_tokens: bool | None = None
    no_stop_trim: bool | None = None
    regex: str | None = None
    ebnf: str | None = None
    rid: RequestId | None = None
    bid: Any = Field(
        default="0", description="Credits: a JSON number or a decimal string; none means 0"
    )
    service_tier: Any = Field(
        default=None,
        description="Under `--pricing tiers`: the tier's name (none or `auto`: the default tier)",
    )

    @classmethod
    def check_raw(cls, data: Mapping[str, Any], limits: BodyLimits) -> None:
        """The fields refused by name, then unknown keys, then the size limits."""
        refused = refused_field(data)
        if refused is not None:
            raise BodyRefused(refused[1], param=refused[0])
        super().check_raw(data, limits)
        check_sampling_limits(data, limits, "")

    @model_validator(mode="after")
    def _extras_as_sglang_checks_them(self) -> OpenAIBody:
        extras = self.sampling_extras()
        if extras:
            # SGLang's own checks: ranges, token-id keys of logit_bias, top_k 0 (the route
            # compares `min_tokens` with the request's own maximum).
            try:
                SamplingParams.model_validate({**extras, "max_new_tokens": 2**31})
            except ValidationError as error:
                raise ValueError(describe_validation_error(error.errors())[0]) from None
        return self

    def sampling_extras(self) -> dict[str, Any]:
        """The engine's sampling parameters for the fields beyond the basic ones, by SGLang's
        names, as SGLang's OpenAI layer passes them."""
        extras: dict[str, Any] = {}
        for name in ("presence_penalty", "frequency_penalty", "logit_bias"):
            if (value := getattr(self, name)) is not None:
                extras[name] = value
        for name, engine_name in SGLANG_SAMPLING_EXTRAS.items():
            if (value := getattr(self, name)) is not None:
                extras[engine_name] = value
        return extras


class CompletionBody(OpenAIBody):
    """`POST /v1/completions` with the extra body field `bid`."""

    prompt: str | list[str] | list[TokenId]
    max_tokens: StrictInt = Field(default=16, ge=0)
    # OpenAI's: the most likely alternatives per token, 0-5 (`server.api.logprobs`).
    logprobs: StrictInt | None = Field(default=None, ge=0, le=5)
    # Refused unless they ask for nothing (`server.api.openai_fields.REFUSED`).
    best_of: Any = None
    echo: Any = None
    suffix: Any = None


class TextPart(BaseModel):
    """A part of a message's content: only text is served."""

    model_config = ConfigDict(extra="ignore")

    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    """One message of a conversation; content parts are joined with a space, as SGLang
    flattens them for a chat template that takes text. An assistant message may carry the
    `tool_calls` it made (its content then may be null), a `tool` message the
    `tool_call_id` it answers (`server.api.tool_calls`)."""

    model_config = ConfigDict(extra="ignore")

    # Validated in this order: whether content may be null depends on the role and the calls.
    role: Literal["system", "user", "assistant", "tool", "developer"]
    tool_calls: list[MessageToolCall] | None = None
    content: str | list[TextPart] | None = Field(default=None, validate_default=True)
    tool_call_id: str | None = Field(default=None, min_length=1, max_length=256)
    name: str | None = None

    @field_validator("tool_calls")
    @classmethod
    def _assistants_call(
        cls, value: list[MessageToolCall] | None, info: ValidationInfo
    ) -> list[MessageToolCall] | None:
        if value and info.data.get("role") != "assistant":
            raise ValueError("only an assistant message carries tool calls")
        return value

    @field_validator("content", mode="before")
    @classmethod
    def _text_parts_only(cls, value: Any, info: ValidationInfo) -> Any:
        if value is None and not info.data.get("tool_calls"):
            raise ValueError("this field is required (null only beside an assistant's tool_calls)")
        # Said here, by part, rather than as the union's first failure ("a valid string").
        if isinstance(value, list):
            for index, part in enumerate(value):
                kind = part.get("type") if isinstance(part, dict) else None
                if kind != "text" or not isinstance(part.get("text"), str):
                    raise ValueError(
                        f"part {index}: only content parts of type 'text' (with a 'text' string) "
                        f"are served, got type {kind!r}"
                    )
        return value

    @property
    def text(self) -> str:
        """The content as one string ("" for an assistant's calls without content)."""
        if self.content is None or isinstance(self.content, str):
            return self.content or ""
        return " ".join(part.text for part in self.content)

    @property
    def has_tool_fields(self) -> bool:
        """Whether rendering it needs the template's tool support."""
        return bool(self.tool_calls) or self.tool_call_id is not None

    def template_message(self) -> dict[str, Any]:
        """The message as SGLang hands it to a chat template: calls' arguments as objects."""
        message: dict[str, Any] = {"role": self.role, "content": self.text}
        if self.content is None:
            message["content"] = None
        if self.tool_calls:
            message["tool_calls"] = [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {
                        "name": call.function.name,
                        "arguments": arguments_object(call.function.arguments),
                    },
                }
                for call in self.tool_calls
            ]
        if self.tool_call_id is not None:
            message["tool_call_id"] = self.tool_call_id
        if self.name is not None:
            message["name"] = self.name
        return message


class ChatBody(OpenAIBody):
    """`POST /v1/chat/completions` with the extra body field `bid`."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: StrictInt | None = Field(default=None, ge=0)
    max_completion_tokens: StrictInt | None = Field(default=None, ge=0)
    # OpenAI's (`server.api.logprobs`): per-token logprobs, and 0-20 alternatives each.
    logprobs: bool | None = None
    top_logprobs: StrictInt | None = Field(default=None, ge=0, le=20)
    # `text`, `json_object` or `json_schema` (`server.api.openai_fields.json_schema_of`).
    response_format: dict[str, Any] | None = None
    # OpenAI's tool calling (`server.api.tool_calls`).
    tools: list[ToolSpec] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None

    @field_validator("tool_choice", mode="before")
    @classmethod
    def _known_choice(cls, value: Any) -> Any:
        # Said here rather than as the union's first failure.
        if value is None or value in ("none", "auto", "required"):
            return value
        if isinstance(value, dict):
            try:
                return NamedToolChoice.model_validate(value)
            except ValidationError as error:
                raise ValueError(describe_validation_error(error.errors())[0]) from None
        raise ValueError(
            "must be 'none', 'auto', 'required' or "
            f'{{"type": "function", "function": {{"name": ...}}}}, got {value!r}'
        )

    def tool_plan(self) -> ToolPlan | None:
        """What the tool fields ask for (None: nothing); a `ValueError` starting with the
        field's name when they do not fit together."""
        return tool_plan(self.tools, self.tool_choice, self.parallel_tool_calls)

    @field_validator("response_format")
    @classmethod
    def _known_format(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        json_schema_of(value)  # a ValueError names what is wrong
        return value


# Top-level keys of SGLang's `GenerateReqInput` and of its OpenAI-compatible requests, plus
# those routers add: known to mean something else, so never taken for a typo of ours.
SGLANG_TOP_LEVEL_KEYS = frozenset(
    {
        "audio", "audio_data", "background", "best_of", "bootstrap_host", "bootstrap_pair_key",
        "bootstrap_port", "bootstrap_room", "cache_salt", "chat_template_kwargs",
        "continue_final_message", "conversation_id", "custom_labels", "custom_logit_processor",
        "data_parallel_rank", "ebnf", "echo", "extra_body", "extra_key", "frequency_penalty",
        "function_call", "functions", "ignore_eos", "image_data", "input_embeds", "json_schema",
        "log_metrics", "logit_bias", "logprob_start_len", "logprobs", "lora_id", "lora_path",
        "metadata", "min_p", "min_tokens", "modalities", "model", "no_logs", "no_stop_trim",
        "parallel_tool_calls", "prediction", "presence_penalty", "priority", "reasoning_effort",
        "regex", "repetition_penalty", "response_format", "return_bytes", "return_entropy",
        "return_hidden_states", "return_logprob", "return_routed_experts",
        "return_text_in_logprobs", "routed_dp_rank", "routing_key", "separate_reasoning",
        "service_tier", "session_params", "skip_special_tokens", "spaces_between_special_tokens",
        "stop_token_ids", "store", "stream_options", "suffix", "tool_choice", "tools",
        "top_k", "top_logprobs", "top_logprobs_num", "token_ids_logprob", "user", "video_data",
    }
)  # fmt: skip


# `/generate` accepts SGLang's request keys, which it ignores as SGLang does, but not a
# `priority` other than 0: the auction sets it, and a client sending one meant a bid.
GenerateBody.ACCEPTED_KEYS = SGLANG_TOP_LEVEL_KEYS - {"priority"}


def _distance(a: str, b: str) -> int:
    """Edit distance with adjacent transpositions (optimal string alignment): `bdi` is 1."""
    previous2: list[int] = []
    previous = list(range(len(b) + 1))
    for i, char_a in enumerate(a, 1):
        current = [i]
        for j, char_b in enumerate(b, 1):
            cost = 0 if char_a == char_b else 1
            best = min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + cost)
            if i > 1 and j > 1 and char_a == b[j - 2] and a[i - 2] == char_b:
                best = min(best, previous2[j - 2] + 1)
            current.append(best)
        previous2, previous = previous, current
    return previous[-1]


def near_miss(key: str, fields: Iterable[str]) -> str | None:
    """The field `key` was probably meant as: the same but for case, or within 2 edits.

    Short names allow fewer edits (half their length), or every two-letter key would be a
    typo of `bid` or `rid`."""
    best: tuple[int, str] | None = None
    for field in fields:
        if key.casefold() == field.casefold():
            return field
        allowed = min(2, len(field) // 2)
        if abs(len(key) - len(field)) > allowed:
            continue
        distance = _distance(key.casefold(), field)
        if distance <= allowed and (best is None or distance < best[0]):
            best = (distance, field)
    return None if best is None else best[1]


# What a bid is called elsewhere: the answer (`bid_micros`), the SDK's parameter (`value`),
# other APIs (`max_bid`), SGLang's own scheduling field (`priority`, which this server sets from
# the auction). Sent under one of these, a bid would be served at 0.
_BID_ELSEWHERE = {
    "bid_micros": "the answer's name for it, in micro-credits",
    "bid_credits": "",
    "max_bid": "",
    "max_bid_micros": "",
    "value": "the SDK's parameter name",
    "price": "",
    "amount": "",
    "priority": "the engine's priority is set from the auction (0 is accepted, as routers send)",
}
# A `priority` that asks for nothing, as routers send it.
_NO_PRIORITY = (0, None)
_BID_HINT = 'the bid is \'bid\', in credits (a number or a decimal string, e.g. "bid": "0.05")'


class UnknownField(ValueError):
    """A top-level key the route does not read; `key` is the key as sent (the error's
    `param`), `meant` the field it was probably meant as, if any."""

    def __init__(self, key: str, meant: str | None = None) -> None:
        if meant is not None:
            message = f"unknown field {key!r}; did you mean {meant!r}?"
        elif key.casefold() in _BID_ELSEWHERE:
            why = _BID_ELSEWHERE[key.casefold()]
            message = f"unknown field {key!r}: {_BID_HINT}" + (f"; {why}" if why else "")
        else:
            message = (
                f"unknown field {key!r}: this endpoint does not read it (its fields are listed "
                "at /docs; a bid goes in 'bid', in credits)"
            )
        super().__init__(message)
        self.key = key
        self.meant = meant


def check_top_level_keys(
    data: Mapping[str, Any], fields: Iterable[str], accepted: frozenset[str] = frozenset()
) -> None:
    """Raise `UnknownField` for the first key that is neither a field nor `accepted`."""
    ordered = list(fields)  # ties go to the first field, the same every time
    known = set(ordered)
    if known.issuperset(data):  # the usual body, only fields of ours: nothing to compare
        return
    for key in data:
        if key in known or key in accepted:
            continue
        if key == "priority" and data[key] in _NO_PRIORITY:
            continue  # what routers (SMG) add to every body they forward: asks for nothing
        if not isinstance(key, str):  # JSON keys are strings; kept for a caller's own mapping
            raise UnknownField(str(key))
        if key.casefold() in _BID_ELSEWHERE:
            raise UnknownField(key)
        raise UnknownField(key, near_miss(key, ordered))


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
