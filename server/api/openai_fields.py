"""What the OpenAI routes do with each field OpenAI's API defines: served, or refused by name.

No field is dropped without a word. Each top-level field of a chat or text completion request is

* read and served: the prompt, the sampling fields (OpenAI's names mapped to SGLang's:
  `max_tokens` -> `max_new_tokens`, `seed` -> `sampling_seed`, the penalties, `logit_bias`),
  `response_format` (JSON object or JSON schema, as SGLang's `json_schema` constraint),
  `logprobs`, `stream`, `service_tier`, tool calling (`tools`, `tool_choice`,
  `parallel_tool_calls`: rendered by the model's chat template, constrained and read as SGLang
  does, `server.api.tool_calls`; on an SGLang engine only), and SGLang's own
  extra sampling fields that its OpenAI routes take (`top_k`, `min_p`, `regex`, ...), passed
  to the engine as SGLang would;
* accepted as a label that changes nothing in the answer (`user`, `metadata`, `store`,
  `stream_options`, ...): `LABELS`;
* or refused with a 400 that names it and says why (`REFUSED`): the deprecated `functions` and
  `function_call` (`tools` and `tool_choice` replace them), audio, other modalities, predicted
  outputs, reasoning controls. A null value is no request, so it passes.

Nothing here imports the web stack: bodies are checked in worker processes too.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

__all__ = [
    "LABELS",
    "REFUSED",
    "SGLANG_SAMPLING_EXTRAS",
    "json_schema_of",
    "refused_field",
]

# OpenAI fields that label a request (for OpenAI's own abuse checks, storage or caching) and
# change nothing in what is generated; SGLang ignores them too. Routers' keys go with them.
LABELS = frozenset(
    {
        "user", "metadata", "store", "safety_identifier", "prompt_cache_key",
        "prompt_cache_retention", "prompt_cache_options", "stream_options",
        # Added by routers in front of SGLang (SMG): routing and logging hints.
        "log_metrics", "no_logs", "routing_key", "routed_dp_rank", "data_parallel_rank",
        "custom_labels", "conversation_id",
    }
)  # fmt: skip

_FUNCTIONS = "the deprecated function calling is not served: send tools and tool_choice"
# Fields refused when set to anything but null (or the one value that asks for nothing).
REFUSED: dict[str, str] = {
    "functions": _FUNCTIONS,
    "function_call": _FUNCTIONS,
    "audio": "audio output is not served (text only)",
    "modalities": 'only ["text"] is served',
    "prediction": "predicted outputs are not served",
    "reasoning_effort": "reasoning controls are not served",
    "verbosity": "verbosity controls are not served",
    "web_search_options": "web search is not served",
    "moderation": "moderation is not served",
    "best_of": "best_of above 1 is not served (one completion per request)",
    "echo": "echo is not served",
    "suffix": "suffix (insertion) is not served",
}
# The value of a refused field that asks for nothing, and so passes.
_HARMLESS: dict[str, Any] = {
    "modalities": ["text"],
    "best_of": 1,
    "echo": False,
    "function_call": "none",
}

# SGLang's sampling fields its OpenAI routes take besides OpenAI's, and their `sampling_params`
# names: passed to the engine as SGLang's own OpenAI layer passes them.
SGLANG_SAMPLING_EXTRAS = {
    "top_k": "top_k",
    "min_p": "min_p",
    "repetition_penalty": "repetition_penalty",
    "min_tokens": "min_new_tokens",
    "stop_token_ids": "stop_token_ids",
    "ignore_eos": "ignore_eos",
    "skip_special_tokens": "skip_special_tokens",
    "no_stop_trim": "no_stop_trim",
    "regex": "regex",
    "ebnf": "ebnf",
}


def refused_field(data: Mapping[str, Any]) -> tuple[str, str] | None:
    """The first refused field `data` sets, with the reason; None when there is none."""
    for key, reason in REFUSED.items():
        value = data.get(key)
        if value is None or (key in _HARMLESS and value == _HARMLESS[key]):
            continue
        return key, f"{key}: {reason}"
    return None


def json_schema_of(response_format: Mapping[str, Any] | None) -> str | None:
    """SGLang's `json_schema` constraint for an OpenAI `response_format` (None: no constraint).

    As SGLang's OpenAI layer maps it: `json_object` is any JSON object, `json_schema` its
    `schema` (a schema without one: any JSON value); `text` asks for nothing. A `ValueError`
    names anything else."""
    if response_format is None:
        return None
    kind = response_format.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return '{"type": "object"}'
    if kind == "json_schema":
        spec = response_format.get("json_schema")
        if not isinstance(spec, Mapping):
            raise ValueError("response_format.json_schema must be an object with a 'schema'")
        schema = spec.get("schema", {})
        if not isinstance(schema, Mapping):
            raise ValueError("response_format.json_schema.schema must be a JSON schema object")
        return json.dumps(schema, separators=(",", ":"), default=float)
    raise ValueError(
        f"response_format.type must be 'text', 'json_object' or 'json_schema', got {kind!r}"
    )
