"""Catch typos in top-level body keys without refusing the keys SGLang's clients add.

SGLang ignores unknown top-level keys, and routers rely on it (they add `model`,
`log_metrics`, `no_logs`...), so an unknown key stays accepted. But a key one slip away from a
field of ours (`bdi`, `Bid`, `sampling_param`) was almost surely meant as that field, and
ignoring it would serve the request differently from what was asked (at bid 0, say): that is
a 400 that names the key and the field.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["SGLANG_TOP_LEVEL_KEYS", "UnknownField", "check_top_level_keys", "near_miss"]

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


# Only so many unknown keys are compared, so that a body of a million keys costs no more.
_KEYS_EXAMINED = 200


class UnknownField(ValueError):
    """A key that is not a field of the body but almost surely meant one; `key` is the key as
    sent (the error's `param`), `meant` the field."""

    def __init__(self, key: str, meant: str) -> None:
        super().__init__(f"unknown field {key!r}; did you mean {meant!r}?")
        self.key = key
        self.meant = meant


def check_top_level_keys(data: Mapping[str, Any], fields: Iterable[str]) -> None:
    """Raise `UnknownField` for the first unknown key that is a near-miss of a field."""
    ordered = list(fields)  # ties go to the first field, the same every time
    known = set(ordered)
    if known.issuperset(data):  # the usual body, only fields of ours: nothing to compare
        return
    unknown = (key for key in data if key not in known and key not in SGLANG_TOP_LEVEL_KEYS)
    for _, key in zip(range(_KEYS_EXAMINED), unknown, strict=False):
        meant = near_miss(key, ordered)
        if meant is not None:
            raise UnknownField(key, meant)
