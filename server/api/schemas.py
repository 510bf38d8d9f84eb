"""Request bodies of the generation endpoints, as SGLang and OpenAI clients send them.

Each body is checked in two steps: `check_raw` on the decoded JSON (cheap, bounded checks that
must come before pydantic walks it: typos of top-level keys, per-field size limits), then the
pydantic model.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Annotated, Any, Literal, Protocol

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictInt,
    StringConstraints,
    field_validator,
    model_validator,
)

from inference_auctions.server.api.field_names import UnknownField, check_top_level_keys, near_miss
from inference_auctions.server.api.json_reader import BodyRefused

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
    """A generation body: unknown top-level keys are ignored (as SGLang ignores them), except
    near-misses of a field, which are refused with the field they were probably meant as."""

    model_config = ConfigDict(extra="ignore")

    @classmethod
    def check_raw(cls, data: Mapping[str, Any], limits: BodyLimits) -> None:
        """Checks on the decoded JSON, before validation; `BodyRefused` names the field."""
        try:
            check_top_level_keys(data, _field_names(cls))
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


class CompletionBody(RequestBody):
    """`POST /v1/completions` with the extra body field `bid`."""

    model: str | None = None
    prompt: str | list[str] | list[TokenId]
    max_tokens: StrictInt = Field(default=16, ge=0)
    temperature: float = Field(default=1.0, ge=0, le=2, allow_inf_nan=False)
    top_p: float = Field(default=1.0, gt=0, le=1, allow_inf_nan=False)
    stop: str | list[str] | None = None
    n: Literal[1] = 1
    stream: bool = False
    seed: StrictInt | None = None
    rid: RequestId | None = None
    # OpenAI's: the most likely alternatives per token, 0-5 (`server.api.logprobs`).
    logprobs: StrictInt | None = Field(default=None, ge=0, le=5)
    bid: Any = Field(
        default="0", description="Credits: a JSON number or a decimal string; none means 0"
    )
    service_tier: Any = Field(
        default=None,
        description="Under `--pricing tiers`: the tier's name (none or `auto`: the default tier)",
    )


class ChatMessage(BaseModel):
    """One message of a conversation."""

    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: str


class ChatBody(RequestBody):
    """`POST /v1/chat/completions` with the extra body field `bid`."""

    model: str | None = None
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: StrictInt | None = Field(default=None, ge=0)
    max_completion_tokens: StrictInt | None = Field(default=None, ge=0)
    temperature: float = Field(default=1.0, ge=0, le=2, allow_inf_nan=False)
    top_p: float = Field(default=1.0, gt=0, le=1, allow_inf_nan=False)
    stop: str | list[str] | None = None
    n: Literal[1] = 1
    stream: bool = False
    seed: StrictInt | None = None
    rid: RequestId | None = None
    # OpenAI's (`server.api.logprobs`): per-token logprobs, and 0-20 alternatives each.
    logprobs: bool | None = None
    top_logprobs: StrictInt | None = Field(default=None, ge=0, le=20)
    bid: Any = Field(
        default="0", description="Credits: a JSON number or a decimal string; none means 0"
    )
    service_tier: Any = Field(
        default=None,
        description="Under `--pricing tiers`: the tier's name (none or `auto`: the default tier)",
    )
