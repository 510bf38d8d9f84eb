"""SGLang-native `POST /generate` with a `bid`, answered exactly as SGLang answers it."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from inference_auctions.server.api.bodies import json_body_schema, parse_body
from inference_auctions.server.api.deps import authenticated
from inference_auctions.server.api.generation import (
    admission_amount,
    admission_of,
    check_max_new_tokens,
    complete,
    prompt_tokens,
    stream,
)
from inference_auctions.server.api.json_response import JSONBytes
from inference_auctions.server.api.logprobs import native_options, refuse_unless_served
from inference_auctions.server.api.schemas import GenerateBody
from inference_auctions.server.api.user_limits import remember
from inference_auctions.server.errors import InvalidRequest
from inference_auctions.server.serving.tickets import Chunk, Clearance

router = APIRouter(tags=["sglang"])

_BODY_SCHEMA = json_body_schema(GenerateBody)


@router.post("/generate", openapi_extra=_BODY_SCHEMA, summary="Generate (SGLang-native)")
async def generate(request: Request) -> Response:
    """SGLang's `/generate` plus `bid` (credits); `meta_info.auction` tells the outcome."""
    state, user = await authenticated(request)
    body = await parse_body(request, GenerateBody)
    if body.return_logprob:
        refuse_unless_served(state, "return_logprob")
    if isinstance(body.text, list):
        raise InvalidRequest("batched requests are not supported; send one prompt per request")
    check_max_new_tokens(
        body.sampling_params.max_new_tokens, state, "sampling_params.max_new_tokens"
    )
    bid_micros = admission_amount(state, body.bid, body.service_tier)
    text = body.text if isinstance(body.text, str) else None
    tokens = await prompt_tokens(state, text, body.input_ids, "text")
    sampling = body.sampling_params.for_engine()
    if body.return_logprob:
        sampling.update(native_options(body))
    payload = {
        "text": body.text,
        "input_ids": body.input_ids,
        "sampling": sampling,
        "bid": bid_micros,
    }
    if body.service_tier is not None:  # a tier named is part of what a retry must repeat
        payload["service_tier"] = body.service_tier
    admission = admission_of(
        user, body.rid, tokens, bid_micros, sampling, payload, streamed=body.stream
    )
    counted = len(tokens) + body.sampling_params.max_new_tokens
    limits = state.user_limits.take_tokens(user, counted, "sampling_params.max_new_tokens")
    remember(request.scope, limits)
    ticket = await state.service.admit(admission)
    if body.stream:
        return stream(state.service, ticket, lambda c, k: render(admission.rid, len(tokens), c, k))
    clearance, final = await complete(request, state.service, ticket)
    return JSONBytes(render(admission.rid, len(tokens), clearance, final))


def render(
    rid: str, prompt_tokens: int, clearance: Clearance, chunk: Chunk | None
) -> dict[str, Any]:
    """One SGLang response object; before the first chunk, an empty one with the auction."""
    if chunk is None:
        meta: dict[str, Any] = {
            "id": rid,
            "finish_reason": None,
            "prompt_tokens": prompt_tokens,
            "completion_tokens": 0,
            "cached_tokens": 0,
        }
        return {"text": "", "output_ids": [], "meta_info": {**meta, "auction": clearance.as_json()}}
    meta = {**chunk.meta_info, "id": rid, "auction": clearance.as_json()}
    return {"text": chunk.text, "output_ids": chunk.output_ids, "meta_info": meta}
