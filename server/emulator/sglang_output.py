"""SGLang-shaped outputs of the emulated engine: `{"text", "output_ids", "meta_info"}`.

`meta_info` has the keys SGLang 0.5.23 returns for a plain text request on a server started with
`--enable-metrics`, in SGLang's order: `id`, `finish_reason`, `prompt_tokens`, `weight_version`,
`num_retractions`, the scheduler's `forward_entry_time`, `prefill_finished_time` and
`queue_time`, then `reasoning_tokens`, `completion_tokens` and `cached_tokens`; a finished
request adds `e2e_latency`, `request_received_ts`, `first_token_latency`, `request_finished_ts`
and, with two or more tokens, `decode_throughput`.

Durations are in model seconds (the simulator's clock); timestamps are `epoch` plus the model
time, where `epoch` is the Unix time at which the engine's clock started. With a time scale of
1 both agree with the wall clock; with a faster clock they describe the modelled GPU.
"""

from __future__ import annotations

from typing import Any

from inference_auctions.server.emulator.output_text import Completion
from inference_auctions.server.emulator.simulator import RequestOutcome

__all__ = ["abort_reason", "generate_output", "length_reason"]


def length_reason(tokens: int) -> dict[str, Any]:
    """SGLang's finish reason for a request that produced its `max_new_tokens`."""
    return {"type": "length", "length": tokens}


def abort_reason(message: str, status_code: int) -> dict[str, Any]:
    """SGLang's finish reason for an aborted request."""
    return {"type": "abort", "message": message, "status_code": status_code, "err_type": None}


def generate_output(
    outcome: RequestOutcome,
    completion: Completion,
    *,
    epoch: float,
    finish_reason: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The `/generate` output of a request as it stands (cumulative text and ids)."""
    tokens = outcome.completion_tokens
    if finish_reason is None and outcome.finished:
        finish_reason = length_reason(outcome.max_new_tokens)
    meta: dict[str, Any] = {
        "id": outcome.rid,
        "finish_reason": finish_reason,
        "prompt_tokens": outcome.prompt_tokens,
        "weight_version": "default",
        "num_retractions": 0,
    }
    if outcome.admitted_at is not None:
        meta["forward_entry_time"] = epoch + outcome.admitted_at
    if outcome.first_token_at is not None:
        meta["prefill_finished_time"] = epoch + outcome.first_token_at
    meta["queue_time"] = outcome.queue_time or 0.0
    meta["reasoning_tokens"] = 0
    meta["completion_tokens"] = tokens
    meta["cached_tokens"] = outcome.cached_tokens
    if outcome.finished_at is not None:
        meta["e2e_latency"] = outcome.finished_at - outcome.arrival
        meta["request_received_ts"] = epoch + outcome.arrival
        if outcome.first_token_at is not None and outcome.first_token_at > outcome.arrival:
            meta["first_token_latency"] = outcome.first_token_at - outcome.arrival
        meta["request_finished_ts"] = epoch + outcome.finished_at
        if outcome.first_token_at is not None and tokens > 1:
            decode = outcome.finished_at - outcome.first_token_at
            if decode > 0:
                meta["decode_throughput"] = (tokens - 1) / decode
    return {
        "text": completion.text(tokens),
        "output_ids": list(completion.token_ids[:tokens]),
        "meta_info": meta,
    }
