"""Reading an SGLang `/generate` body the way SGLang 0.5.23 does, for the emulated engine.

SGLang checks a body in two stages, and the emulator keeps both so that a client sees the same
status and the same error shape from either:

* the JSON contract (`sglang.api.v1`): wrong types and unknown `sampling_params` keys are a
  `ContractError`, which SGLang answers with 400 `{"error": "<text>"}` before it starts a
  stream; the texts follow the contract's serde-style wording ("unknown field `x`, expected one
  of ...");
* request semantics (no prompt, a batch, out-of-range values): a plain `ValueError`, answered
  with 400 `{"error": {"message": ...}}`, or inside the stream for a streamed request.

Unknown top-level keys are ignored, as in SGLang. Batches (a list of prompts) are refused: the
emulator serves one request per call.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from inference_auctions.server.engine.protocol import (
    DEFAULT_MAX_NEW_TOKENS,
    REQUEST_LEVEL_KEYS,
)

__all__ = [
    "DEFAULT_MAX_NEW_TOKENS",
    "LOGPROBS_REFUSED",
    "REQUEST_LEVEL_KEYS",
    "SAMPLING_PARAM_NAMES",
    "ContractError",
    "GenerateInput",
    "SamplingOptions",
    "check_vocabulary",
    "parse_generate_body",
    "parse_sampling_params",
]

LOGPROBS_REFUSED = (
    "return_logprob: the SGLang emulator returns no logprobs (it has no model to score tokens with)"
)
_INT64_LIMIT = 2**63


class ContractError(ValueError):
    """The body breaks SGLang's JSON contract (400 with a plain-text `error`)."""


@dataclass(frozen=True, slots=True)
class SamplingOptions:
    """The sampling parameters the emulator acts on; the others are checked and ignored."""

    max_new_tokens: int | None = DEFAULT_MAX_NEW_TOKENS
    sampling_seed: int | None = None
    # As the client sent it (None when absent): SGLang checks only an explicit value against
    # the context length.
    requested_max_new_tokens: int | None = None
    # Tokens per streamed chunk (None or 0: the server's default, one); see `LiveSimulator`.
    stream_interval: int | None = None


@dataclass(frozen=True, slots=True)
class GenerateInput:
    """One single-prompt `/generate` request, checked."""

    rid: str | None
    text: str | None
    input_ids: list[int] | None
    sampling: SamplingOptions
    stream: bool
    priority: int | None


def _describe(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"boolean `{'true' if value else 'false'}`"
    if isinstance(value, int):
        return f"integer `{value}`"
    if isinstance(value, float):
        return f"floating point `{value}`"
    if isinstance(value, str):
        return f'string "{value}"'
    if isinstance(value, list):
        return "sequence"
    if isinstance(value, dict):
        return "map"
    return type(value).__name__


def _invalid(value: Any, expected: str) -> ContractError:
    return ContractError(f"invalid type: {_describe(value)}, expected {expected}")


def _unknown_field(key: str) -> ContractError:
    listed = ", ".join(f"`{name}`" for name in SAMPLING_PARAM_NAMES)
    return ContractError(f"unknown field `{key}`, expected one of {listed}")


def _int64(value: Any) -> int:
    # The contract checks the JSON type only, not the range.
    if isinstance(value, bool) or not isinstance(value, int):
        raise _invalid(value, "i64")
    return value


def _token_ids(value: Any) -> tuple[list[int], bool]:
    """Contract-check `input_ids`: the ids, and whether it was a batch (a list of lists)."""
    if not isinstance(value, list):
        raise _invalid(value, "a value or an array of values for TokenIdsOrList")
    # As the contract decodes it: a list whose first item is not a number is a batch.
    if value and (isinstance(value[0], bool) or not isinstance(value[0], int | float)):
        for item in value:
            if not isinstance(item, list):
                raise _invalid(item, "a sequence")
            for token in item:
                _int64(token)
        return [], True
    return [_int64(token) for token in value], False


def _check_float(value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _invalid(value, "f64")


def _check_bool(value: Any) -> None:
    if not isinstance(value, bool):
        raise _invalid(value, "a boolean")


def _check_str(value: Any) -> None:
    if not isinstance(value, str):
        raise _invalid(value, "a string")


def _check_str_or_list(value: Any) -> None:
    if not isinstance(value, str | list):
        raise _invalid(value, "a value or an array of values for StringOrList")
    if isinstance(value, list):
        for item in value:
            _check_str(item)


def _check_str_list(value: Any) -> None:
    if not isinstance(value, list):
        raise _invalid(value, "a sequence")
    for item in value:
        _check_str(item)


def _check_watermark(value: Any) -> None:
    if not isinstance(value, dict):
        raise _invalid(value, "struct WatermarkRequestConfig")


def _check_token_list(value: Any) -> None:
    if not isinstance(value, list):
        raise _invalid(value, "a sequence")
    for token in value:
        _int64(token)


def _check_map(value: Any) -> None:
    if not isinstance(value, dict):
        raise _invalid(value, "a map")


def _check_nothing(value: Any) -> None:
    pass


# How each sampling parameter's JSON type is checked (null always passes), in the contract's
# order, which is the order its unknown-field message lists them in.
_PARAM_CHECKS: dict[str, Callable[[Any], object]] = {
    "max_new_tokens": _int64,
    "stop": _check_str_or_list,
    "stop_token_ids": _check_token_list,
    "stop_regex": _check_str_or_list,
    "temperature": _check_float,
    "top_p": _check_float,
    "top_k": _int64,
    "min_p": _check_float,
    "frequency_penalty": _check_float,
    "presence_penalty": _check_float,
    "repetition_penalty": _check_float,
    "min_new_tokens": _int64,
    "n": _int64,
    "json_schema": _check_str,
    "regex": _check_str,
    "ebnf": _check_str,
    "structural_tag": _check_str,
    "ignore_eos": _check_bool,
    "skip_special_tokens": _check_bool,
    "spaces_between_special_tokens": _check_bool,
    "no_stop_trim": _check_bool,
    "stream_interval": _int64,
    "logit_bias": _check_map,
    "sampling_seed": _int64,
    "custom_params": _check_nothing,
    "beam_width": _int64,
    "watermark": _check_watermark,
    "choice": _check_str_list,
}
SAMPLING_PARAM_NAMES = tuple(_PARAM_CHECKS)


def _check_sampling_contract(params: Any) -> None:
    if isinstance(params, list):
        for item in params:
            _check_sampling_fields(item)
    elif isinstance(params, Mapping):
        _check_sampling_fields(params)
    else:
        raise _invalid(params, "a value or an array of values for SamplingParamsOrList")


def _check_sampling_fields(params: Any) -> None:
    if not isinstance(params, Mapping):
        raise _invalid(params, "struct SamplingParams")
    for key, value in params.items():
        check = _PARAM_CHECKS.get(key)
        if check is None:
            raise _unknown_field(str(key))
        if value is not None:
            check(value)


def _sampling_options(params: Mapping[str, Any]) -> SamplingOptions:
    """The semantic checks SGLang makes once the contract holds."""
    max_new_tokens = params.get("max_new_tokens", DEFAULT_MAX_NEW_TOKENS)
    if max_new_tokens is not None and max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be at least 0, got {max_new_tokens}.")
    temperature = params.get("temperature")
    if temperature is not None and (not math.isfinite(temperature) or temperature < 0):
        raise ValueError(f"temperature must be a non-negative finite number, got {temperature}.")
    top_p = params.get("top_p")
    if top_p is not None and not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}.")
    if params.get("n") not in (None, 1):
        raise ValueError("Parallel sampling (n > 1) is not supported by this engine.")
    return SamplingOptions(
        max_new_tokens,
        params.get("sampling_seed"),
        params.get("max_new_tokens"),
        params.get("stream_interval"),
    )


def parse_sampling_params(params: Any) -> SamplingOptions:
    """Check `sampling_params` as SGLang does; unknown keys are a `ContractError`."""
    if params is None:
        return SamplingOptions()
    _check_sampling_contract(params)
    if isinstance(params, list):
        raise ValueError("Batch requests are not supported by this engine.")
    return _sampling_options(params)


def parse_generate_body(body: Any) -> GenerateInput:
    """Check a parsed `/generate` JSON body (see the module docstring for the two errors)."""
    # The whole contract first, as SGLang checks it before anything else.
    if not isinstance(body, dict):
        raise _invalid(body, "struct GenerateRequest")
    rid, text, input_ids = body.get("rid"), body.get("text"), body.get("input_ids")
    for value in (rid, text):
        if value is not None:
            _check_str_or_list(value)
    tokens, batch = _token_ids(input_ids) if input_ids is not None else (None, False)
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise _invalid(stream, "a boolean")
    priority = body.get("priority")
    if priority is not None:
        priority = _int64(priority)
    params = body.get("sampling_params")
    if params is not None:
        _check_sampling_contract(params)
    # Then what SGLang checks while handling the request, and what the emulator cannot do.
    if body.get("return_logprob"):
        raise ValueError(LOGPROBS_REFUSED)
    if batch or isinstance(rid, list) or isinstance(text, list) or isinstance(params, list):
        raise ValueError("Batch requests are not supported by this engine.")
    if (text is None) == (tokens is None):
        raise ValueError("Either text, input_ids or input_embeds should be provided.")
    if tokens is not None:
        if not tokens:
            raise ValueError("The input_ids must not be empty.")
        if any(not 0 <= token < _INT64_LIMIT for token in tokens):
            raise ValueError("The input_ids must be token ids in [0, 2^63).")
    sampling = SamplingOptions() if params is None else _sampling_options(params)
    return GenerateInput(rid, text, tokens, sampling, bool(stream), priority)


def check_vocabulary(input_ids: Sequence[int], vocab_size: int) -> None:
    """Refuse token ids the model has no embedding for.

    SGLang 0.5.23 checks none of a prompt's ids: one at or above its vocabulary size kills its
    scheduler (an IndexError in the embedding), and with it every request it holds. The message
    follows SGLang's own for `token_ids_logprob`.
    """
    if len(input_ids) == 0 or (min(input_ids) >= 0 and max(input_ids) < vocab_size):
        return
    bad = next(token for token in input_ids if not 0 <= token < vocab_size)
    raise ValueError(
        f"input_ids contains out-of-vocabulary token id {bad}; valid range is [0, {vocab_size})."
    )
