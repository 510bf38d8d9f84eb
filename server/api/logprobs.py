"""Log probabilities: passed through to a real SGLang, refused by name by the emulator.

One rule for SGLang's native `return_logprob` (with `logprob_start_len`, `top_logprobs_num`,
`token_ids_logprob`, `return_text_in_logprobs`) and OpenAI's `logprobs` / `top_logprobs`:
when the engine is an SGLang server, the request asks it for them and the answer carries what
it computed (natively in `meta_info`, untouched; for OpenAI in OpenAI's shapes, built from
that `meta_info`); the embedded emulator has no model to score tokens with, so a request
that asks for them is a 400 naming the field, before any money moves.

The options travel with the request's sampling parameters (they are part of its payload's
fingerprint) and the SGLang backend lifts them to the top level of its `/generate` body
(`server.engine.protocol.REQUEST_LEVEL_KEYS`).
"""

from __future__ import annotations

from typing import Any

from inference_auctions.server.api.deps import AppState
from inference_auctions.server.api.schemas import GenerateBody
from inference_auctions.server.errors import InvalidRequest

__all__ = [
    "chat_logprobs",
    "completion_logprobs",
    "native_options",
    "new_entries",
    "openai_options",
    "refuse_unless_served",
]

_REFUSED = (
    "{field}: this server returns no logprobs here: the embedded SGLang emulator has no model "
    "to score tokens with, so SGLang's frontend `select` cannot run on it either; constrain "
    "`gen` with a `regex` such as '(yes|no)' instead. In front of a real SGLang "
    "(--engine-url) logprobs are passed through"
)


def refuse_unless_served(state: AppState, field: str) -> None:
    """A 400 naming `field` unless the engine is an SGLang server, which computes logprobs."""
    if state.service.engine_name != "sglang":
        raise InvalidRequest(_REFUSED.format(field=field), param=field)


def native_options(body: GenerateBody) -> dict[str, Any]:
    """SGLang's logprob options the client set, for the engine."""
    options: dict[str, Any] = {"return_logprob": True}
    for key in ("logprob_start_len", "top_logprobs_num", "token_ids_logprob"):
        value = getattr(body, key)
        if value is not None:
            options[key] = value
    if body.return_text_in_logprobs:
        options["return_text_in_logprobs"] = True
    return options


def openai_options(top: int | None) -> dict[str, Any]:
    """What OpenAI's `logprobs` asks of SGLang: each output token's, with `top` alternatives."""
    return {"return_logprob": True, "top_logprobs_num": top or 0, "return_text_in_logprobs": True}


def _entries(meta: dict[str, Any], key: str) -> list[Any]:
    value = meta.get(key)
    return value if isinstance(value, list) else []


def _token(entry: Any) -> tuple[float | None, str]:
    """(logprob, token text) of SGLang's `[logprob, token_id, text]` entry."""
    if not isinstance(entry, list | tuple) or len(entry) < 2:
        return None, ""
    logprob, token_id = entry[0], entry[1]
    text = entry[2] if len(entry) > 2 and isinstance(entry[2], str) else f"<{token_id}>"
    return (float(logprob) if isinstance(logprob, int | float) else None), text


def new_entries(meta: dict[str, Any], sent: int) -> tuple[list[Any], list[Any], int]:
    """The output logprobs (and top ones) not sent yet, and how many are sent after them.

    SGLang's streamed chunks carry either every token's so far or only the new ones; which
    one is told by comparing with `completion_tokens`."""
    tokens, top = _entries(meta, "output_token_logprobs"), _entries(meta, "output_top_logprobs")
    completion = meta.get("completion_tokens")
    if isinstance(completion, int) and len(tokens) == completion and completion >= sent:
        return tokens[sent:], top[sent:], completion
    return tokens, top, sent + len(tokens)


def completion_logprobs(tokens: list[Any], top: list[Any]) -> dict[str, Any]:
    """OpenAI's `/v1/completions` `logprobs` object."""
    pairs = [_token(entry) for entry in tokens]
    offsets, position = [], 0
    for _, text in pairs:
        offsets.append(position)
        position += len(text)
    top_maps = []
    for alternatives in top:
        entries = alternatives if isinstance(alternatives, list) else []
        top_maps.append({text: lp for lp, text in map(_token, entries)})
    return {
        "tokens": [text for _, text in pairs],
        "token_logprobs": [lp for lp, _ in pairs],
        "top_logprobs": top_maps or None,
        "text_offset": offsets,
    }


def chat_logprobs(tokens: list[Any], top: list[Any]) -> dict[str, Any]:
    """OpenAI's `/v1/chat/completions` `logprobs` object."""
    content = []
    for index, entry in enumerate(tokens):
        logprob, text = _token(entry)
        alternatives = top[index] if index < len(top) and isinstance(top[index], list) else []
        content.append(
            {
                "token": text,
                "logprob": logprob,
                "bytes": list(text.encode()),
                "top_logprobs": [
                    {"token": t, "logprob": lp, "bytes": list(t.encode())}
                    for lp, t in map(_token, alternatives)
                ],
            }
        )
    return {"content": content}
