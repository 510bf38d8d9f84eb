"""OpenAI-compatible `/v1/completions`, `/v1/chat/completions` and `/v1/models`.

`bid` is an extra body field (`extra_body={"bid": "0.25"}` in the `openai` client); every
response carries the same top-level `auction` object as `meta_info.auction` of `/generate`.
Streamed chunks carry the text delta, as OpenAI's do.
"""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from inference_auctions.billing import UserInfo
from inference_auctions.server.api.bodies import json_body_schema, parse_body
from inference_auctions.server.api.deps import AppState, State, authenticated
from inference_auctions.server.api.generation import (
    admission_amount,
    admission_of,
    check_max_new_tokens,
    complete,
    prompt_tokens,
    stream,
)
from inference_auctions.server.api.json_response import JSONBytes
from inference_auctions.server.api.logprobs import (
    chat_logprobs,
    completion_logprobs,
    new_entries,
    openai_options,
    refuse_unless_served,
)
from inference_auctions.server.api.schemas import ChatBody, ChatMessage, CompletionBody
from inference_auctions.server.api.user_limits import remember
from inference_auctions.server.errors import InvalidRequest
from inference_auctions.server.serving.tickets import Chunk, Clearance

router = APIRouter(prefix="/v1", tags=["openai"])


def _schema(model: type[CompletionBody] | type[ChatBody]) -> dict[str, Any]:
    return json_body_schema(model)


@router.get("/models", summary="List models")
async def models(state: State) -> dict[str, Any]:
    """The one model this server serves; no key needed (routers probe it, as SGLang's)."""
    name = state.settings.model_name
    entry = {"id": name, "object": "model", "created": 0, "owned_by": "inference-auctions"}
    return {"object": "list", "data": [entry]}


@router.post("/completions", openapi_extra=_schema(CompletionBody), summary="Completions")
async def completions(request: Request) -> Response:
    """OpenAI text completion with a bid."""
    state, user = await authenticated(request)
    body = await parse_body(request, CompletionBody)
    prompt = body.prompt
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
        if len(prompt) != 1:
            raise InvalidRequest("send one prompt per request", param="prompt")
        prompt = prompt[0]
    text = prompt if isinstance(prompt, str) else None
    ids = None if isinstance(prompt, str) else [int(t) for t in prompt]
    check_max_new_tokens(body.max_tokens, state, "max_tokens")
    sampling = _sampling(body.max_tokens, body.temperature, body.top_p, body.stop, body.seed)
    if body.logprobs is not None:
        refuse_unless_served(state, "logprobs")
        sampling.update(openai_options(body.logprobs))
    return await _run(
        request,
        user,
        state,
        rid=body.rid,
        bid_value=body.bid,
        tier_value=body.service_tier,
        text=text,
        input_ids=ids,
        sampling=sampling,
        streamed=body.stream,
        kind="text_completion",
    )


@router.post("/chat/completions", openapi_extra=_schema(ChatBody), summary="Chat completions")
async def chat_completions(request: Request) -> Response:
    """OpenAI chat completion with a bid."""
    state, user = await authenticated(request)
    body = await parse_body(request, ChatBody)
    limit = (
        body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
    )
    max_tokens = 128 if limit is None else limit
    check_max_new_tokens(max_tokens, state, "max_tokens")
    sampling = _sampling(max_tokens, body.temperature, body.top_p, body.stop, body.seed)
    if body.logprobs or body.top_logprobs is not None:
        refuse_unless_served(state, "logprobs" if body.logprobs else "top_logprobs")
        sampling.update(openai_options(body.top_logprobs))
    text = chat_prompt(body.messages)
    return await _run(
        request,
        user,
        state,
        rid=body.rid,
        bid_value=body.bid,
        tier_value=body.service_tier,
        text=text,
        input_ids=None,
        sampling=sampling,
        streamed=body.stream,
        kind="chat.completion",
        messages=[(m.role, m.content) for m in body.messages],
    )


def chat_prompt(messages: list[ChatMessage]) -> str:
    """A plain role-tagged transcript ending with the assistant's turn: the request's payload
    (its fingerprint), and the prompt the emulator tokenizes. An SGLang engine renders the
    messages with the served model's own chat template instead (`Engine.tokenize_chat`).

    Every conversation that shares its first messages shares a prompt prefix, so the cache
    and the auction's tree see multi-turn chats as the prefix tree they are.
    """
    turns = "".join(f"<|{m.role}|>\n{m.content}\n" for m in messages)
    return turns + "<|assistant|>\n"


def _sampling(
    max_tokens: int,
    temperature: float,
    top_p: float,
    stop: str | list[str] | None,
    seed: int | None,
) -> dict[str, Any]:
    params: dict[str, Any] = {
        "max_new_tokens": max_tokens,
        "temperature": temperature,
        "top_p": top_p,
    }
    if stop is not None:
        params["stop"] = stop
    if seed is not None:
        params["sampling_seed"] = seed
    return params


async def _run(
    request: Request,
    user: UserInfo,
    state: AppState,
    *,
    rid: str | None,
    bid_value: Any,
    tier_value: Any,
    text: str | None,
    input_ids: list[int] | None,
    sampling: dict[str, Any],
    streamed: bool,
    kind: str,
    messages: list[tuple[str, str]] | None = None,
) -> Response:
    bid_micros = admission_amount(state, bid_value, tier_value)
    field = "prompt" if messages is None else "messages"
    tokens = await prompt_tokens(state, text, input_ids, field, messages)
    payload = {
        "kind": kind,
        "text": text,
        "input_ids": input_ids,
        "sampling": sampling,
        "bid": bid_micros,
    }
    if tier_value is not None:  # a tier named is part of what a retry must repeat
        payload["service_tier"] = tier_value
    admission = admission_of(user, rid, tokens, bid_micros, sampling, payload, streamed=streamed)
    counted = len(tokens) + sampling["max_new_tokens"]
    remember(request.scope, state.user_limits.take_tokens(user, counted, "max_tokens"))
    ticket = await state.service.admit(admission)
    model = state.settings.model_name
    renderer = _Renderer(admission.rid, model, kind, logprobs="return_logprob" in sampling)
    if streamed:
        return stream(state.service, ticket, renderer.chunk)
    clearance, final = await complete(request, state.service, ticket)
    return JSONBytes(renderer.whole(clearance, final))


class _Renderer:
    """OpenAI-shaped bodies of one request: whole, or streamed as text deltas."""

    def __init__(self, rid: str, model: str, kind: str, logprobs: bool = False) -> None:
        self.rid, self.model, self.kind = rid, model, kind
        self.created = int(time.time())
        self._sent = 0
        self.logprobs = logprobs  # asked of the engine: OpenAI's shape of them goes out
        self._logprobs_sent = 0

    def _logprobs(self, meta: dict[str, Any]) -> dict[str, Any] | None:
        """OpenAI's logprobs of the tokens not sent yet (None when not asked for)."""
        if not self.logprobs:
            return None
        tokens, top, self._logprobs_sent = new_entries(meta, self._logprobs_sent)
        if self.kind == "chat.completion":
            return chat_logprobs(tokens, top)
        return completion_logprobs(tokens, top)

    def _envelope(self, clearance: Clearance, suffix: str = "") -> dict[str, Any]:
        return {
            "id": self.rid,
            "object": self.kind + suffix,
            "created": self.created,
            "model": self.model,
            "auction": clearance.as_json(),
        }

    def whole(self, clearance: Clearance, final: Chunk) -> dict[str, Any]:
        """The non-streamed response."""
        reason = finish_reason(final.meta_info)
        logprobs = self._logprobs(final.meta_info)
        if self.kind == "chat.completion":
            message = {"role": "assistant", "content": final.text}
            choice: dict[str, Any] = {"index": 0, "message": message, "finish_reason": reason}
            if logprobs is not None:
                choice["logprobs"] = logprobs
        else:
            choice = {"index": 0, "text": final.text, "finish_reason": reason, "logprobs": logprobs}
        return {**self._envelope(clearance), "choices": [choice], "usage": usage(final.meta_info)}

    def chunk(self, clearance: Clearance, chunk: Chunk | None) -> dict[str, Any]:
        """One streamed chunk: the delta since the previous one (empty before the first)."""
        delta = ""
        reason = None
        logprobs = None
        if chunk is not None:
            delta, self._sent = chunk.text[self._sent :], len(chunk.text)
            reason = finish_reason(chunk.meta_info)
            logprobs = self._logprobs(chunk.meta_info)
        if self.kind == "chat.completion":
            content: dict[str, Any] = {"content": delta}
            if chunk is None:
                content["role"] = "assistant"
            choice: dict[str, Any] = {"index": 0, "delta": content, "finish_reason": reason}
            if logprobs is not None:
                choice["logprobs"] = logprobs
        else:
            choice = {"index": 0, "text": delta, "finish_reason": reason, "logprobs": logprobs}
        body = {
            **self._envelope(clearance, ".chunk" if self.kind == "chat.completion" else ""),
            "choices": [choice],
        }
        if reason is not None and chunk is not None:
            body["usage"] = usage(chunk.meta_info)
        return body


def finish_reason(meta: dict[str, Any]) -> str | None:
    """OpenAI's finish reason from SGLang's `{"type": ...}` object."""
    reason = meta.get("finish_reason")
    if not reason:
        return None
    kind = reason.get("type") if isinstance(reason, dict) else str(reason)
    return {"length": "length", "stop": "stop"}.get(str(kind), str(kind))


def usage(meta: dict[str, Any]) -> dict[str, Any]:
    """OpenAI's usage object, with SGLang's cached tokens as `prompt_tokens_details`."""
    prompt = int(meta.get("prompt_tokens", 0))
    completion = int(meta.get("completion_tokens", 0))
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": int(meta.get("cached_tokens", 0))},
    }
