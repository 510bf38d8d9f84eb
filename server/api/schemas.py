"""Request bodies of the generation endpoints, as SGLang and OpenAI clients send them."""

from __future__ import annotations

import math
from decimal import Decimal
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt, StringConstraints, field_validator

# A rid is the client's idempotency key; it also reaches the ledger and the engine.
RequestId = Annotated[
    str, StringConstraints(min_length=1, max_length=96, pattern=r"^[A-Za-z0-9._:@+=-]+$")
]
TokenId = Annotated[StrictInt, Field(ge=0, lt=2**31)]
FiniteFloat = Annotated[float, Field(allow_inf_nan=False)]


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


class SamplingParams(BaseModel):
    """SGLang's sampling parameters; an unknown key is a 400, as SGLang answers it."""

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
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    no_stop_trim: bool = False
    n: Literal[1] = 1
    regex: str | None = None
    json_schema: str | None = None
    ebnf: str | None = None
    sampling_seed: StrictInt | None = None
    logit_bias: dict[str, FiniteFloat] | None = None
    custom_params: dict[str, Any] | None = None

    @field_validator("custom_params")
    @classmethod
    def _sendable(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        return None if value is None else _engine_json(value)

    def for_engine(self) -> dict[str, Any]:
        """Only what the client set, so the engine keeps its own defaults for the rest."""
        return self.model_dump(exclude_unset=True)


class GenerateBody(BaseModel):
    """`POST /generate`: SGLang's request plus `bid` (credits; number or decimal string)."""

    model_config = ConfigDict(extra="ignore")  # SGLang ignores unknown top-level keys too

    text: str | list[str] | None = None
    input_ids: list[TokenId] | None = None
    sampling_params: SamplingParams = Field(default_factory=SamplingParams)
    rid: RequestId | None = None
    stream: bool = False
    bid: Any = Field(default="0", description="Credits: a JSON number or a decimal string")


class CompletionBody(BaseModel):
    """`POST /v1/completions` with the extra body field `bid`."""

    model_config = ConfigDict(extra="ignore")

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
    bid: Any = Field(default="0", description="Credits: a JSON number or a decimal string")


class ChatMessage(BaseModel):
    """One message of a conversation."""

    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: str


class ChatBody(BaseModel):
    """`POST /v1/chat/completions` with the extra body field `bid`."""

    model_config = ConfigDict(extra="ignore")

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
    bid: Any = Field(default="0", description="Credits: a JSON number or a decimal string")
