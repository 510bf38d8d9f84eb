"""OpenAI-compatible `/v1/completions`, `/v1/chat/completions` and `/v1/models`.

`bid` is an extra body field (`extra_body={"bid": "0.25"}` in the `openai` client); every
response carries the same top-level `auction` object as `meta_info.auction` of `/generate`,
and, under `--pricing tiers`, the tier served as `service_tier`. Streamed chunks carry the text
delta, as OpenAI's do. Each field OpenAI defines is served or refused by name
(`server.api.openai_fields`); a `model` this server does not serve is a 404
(`server.api.model_name`).
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
    ToolChat,
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
from inference_auctions.server.api.model_name import check_model, served_model
from inference_auctions.server.api.openai_fields import json_schema_of
from inference_auctions.server.api.schemas import ChatBody, ChatMessage, CompletionBody, OpenAIBody
from inference_auctions.server.api.tool_call_parser import (
    CALL_OPEN,
    calls_in,
    openai_tool_calls,
    streamable_end,
)
from inference_auctions.server.api.tool_calls import ToolPlan
from inference_auctions.server.api.user_limits import remember
from inference_auctions.server.errors import InvalidRequest
from inference_auctions.server.serving.tickets import Chunk, Clearance

router = APIRouter(prefix="/v1", tags=["openai"])


def _schema(model: type[CompletionBody] | type[ChatBody]) -> dict[str, Any]:
    return json_body_schema(model)


@router.get("/models", summary="List models")
async def models(state: State) -> dict[str, Any]:
    """The one model this server serves; no key needed (routers probe it, as SGLang's)."""
    name = served_model(state)
    entry = {"id": name, "object": "model", "created": 0, "owned_by": "inference-auctions"}
    return {"object": "list", "data": [entry]}


@router.post("/completions", openapi_extra=_schema(CompletionBody), summary="Completions")
async def completions(request: Request) -> Response:
    """OpenAI text completion with a bid."""
    state, user = await authenticated(request)
    body = await parse_body(request, CompletionBody)
    check_model(state, body.model)
    prompt = body.prompt
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
        if len(prompt) != 1:
            raise InvalidRequest("send one prompt per request", param="prompt")
        prompt = prompt[0]
    text = prompt if isinstance(prompt, str) else None
    ids = None if isinstance(prompt, str) else [int(t) for t in prompt]
    check_max_new_tokens(body.max_tokens, state, "max_tokens")
    sampling = _sampling(body, body.max_tokens)
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
    check_model(state, body.model)
    limit = (
        body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
    )
    max_tokens = 128 if limit is None else limit
    check_max_new_tokens(max_tokens, state, "max_tokens")
    sampling = _sampling(body, max_tokens)
    if body.logprobs or body.top_logprobs is not None:
        refuse_unless_served(state, "logprobs" if body.logprobs else "top_logprobs")
        sampling.update(openai_options(body.top_logprobs))
    schema = json_schema_of(body.response_format)
    if schema is not None:
        refuse_unless_constrained(state, "response_format")
        sampling["json_schema"] = schema
    plan, chat = _tool_chat(state, body)
    if plan is not None and plan.constrained:
        if schema is not None:
            raise InvalidRequest(
                "response_format: cannot constrain the answer to a JSON schema as well as to "
                f"tool calls (tool_choice {_written(plan)})",
                param="response_format",
            )
        sampling["json_schema"] = plan.json_schema()
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
        messages=chat or [(m.role, m.text) for m in body.messages],
        tools=plan,
    )


def _written(plan: ToolPlan) -> str:
    """The tool choice as the client wrote it, for messages."""
    return f"naming {plan.choice!r}" if plan.named else repr(plan.choice)


def _tool_chat(state: AppState, body: ChatBody) -> tuple[ToolPlan | None, ToolChat | None]:
    """What a chat's tool fields ask for (None: nothing), and the chat as its template is to
    see it (None: a plain chat, without tools offered or tool calls in it); a 400 naming the
    field for what cannot be served."""
    try:
        plan = body.tool_plan()
    except ValueError as error:
        raise InvalidRequest(str(error), param=str(error).split(":", 1)[0]) from None
    history = any(message.has_tool_fields for message in body.messages)
    if (plan is None or not plan.parses) and not history:
        return plan, None  # `none` shows the template no tools: a plain chat
    field = "tools" if plan is not None else "messages"
    if state.service.engine_name != "sglang":
        raise InvalidRequest(
            f"{field}: the embedded emulator cannot call tools (it generates no real text and "
            "its chat template has no tools); an SGLang engine (--engine-url) serves them",
            param=field,
        )
    messages = [message.template_message() for message in body.messages]
    return plan, ToolChat(messages, plan.template_tools() if plan is not None else None)


def chat_prompt(messages: list[ChatMessage]) -> str:
    """A plain role-tagged transcript ending with the assistant's turn: the request's payload
    (its fingerprint), and the prompt the emulator tokenizes. An SGLang engine renders the
    messages with the served model's own chat template instead (`Engine.tokenize_chat`).

    Every conversation that shares its first messages shares a prompt prefix, so the cache
    and the auction's tree see multi-turn chats as the prefix tree they are.
    """
    turns = "".join(f"<|{m.role}|>\n{m.text}\n" for m in messages)
    return turns + "<|assistant|>\n"


def _sampling(body: OpenAIBody, max_tokens: int) -> dict[str, Any]:
    """SGLang's sampling parameters for an OpenAI body, by SGLang's names."""
    params: dict[str, Any] = {
        "max_new_tokens": max_tokens,
        "temperature": body.temperature,
        "top_p": body.top_p,
    }
    if body.stop is not None:
        params["stop"] = body.stop
    if body.seed is not None:
        params["sampling_seed"] = body.seed
    params.update(body.sampling_extras())
    if params.get("min_new_tokens", 0) > max_tokens:
        raise InvalidRequest(
            f"min_tokens ({params['min_new_tokens']}) must be at most max_tokens ({max_tokens})",
            param="min_tokens",
        )
    return params


def refuse_unless_constrained(state: AppState, field: str) -> None:
    """A 400 naming `field` unless the engine is an SGLang server, which constrains output to
    a JSON schema; the emulator generates no real text to constrain."""
    if state.service.engine_name != "sglang":
        raise InvalidRequest(
            f"{field}: the embedded emulator cannot constrain its output to JSON (it generates "
            "no real text); an SGLang engine (--engine-url) serves it",
            param=field,
        )


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
    messages: list[tuple[str, str]] | ToolChat | None = None,
    tools: ToolPlan | None = None,
) -> Response:
    bid_micros = admission_amount(state, bid_value, tier_value)
    field = "prompt" if messages is None else "messages"
    tokens = await prompt_tokens(state, text, input_ids, field, messages)
    payload: dict[str, Any] = {
        "kind": kind,
        "text": text,
        "input_ids": input_ids,
        "sampling": sampling,
        "bid": bid_micros,
    }
    if isinstance(messages, ToolChat):  # what the plain transcript leaves out
        payload["tool_chat"] = {"messages": messages.messages, "tools": messages.tools}
        if tools is not None:
            payload["tool_choice"] = [tools.choice, tools.named, tools.parallel]
    if tier_value is not None:  # a tier named is part of what a retry must repeat
        payload["service_tier"] = tier_value
    admission = admission_of(user, rid, tokens, bid_micros, sampling, payload, streamed=streamed)
    counted = len(tokens) + sampling["max_new_tokens"]
    remember(request.scope, state.user_limits.take_tokens(user, counted, "max_tokens"))
    ticket = await state.service.admit(admission)
    model = served_model(state)
    renderer = _Renderer(
        admission.rid,
        model,
        kind,
        logprobs="return_logprob" in sampling,
        tools=tools if tools is not None and tools.parses else None,
    )
    if streamed:
        return stream(state.service, ticket, renderer.chunk)
    clearance, final = await complete(request, state.service, ticket)
    return JSONBytes(renderer.whole(clearance, final))


class _Renderer:
    """OpenAI-shaped bodies of one request: whole, or streamed as text deltas."""

    def __init__(
        self, rid: str, model: str, kind: str, logprobs: bool = False, tools: ToolPlan | None = None
    ) -> None:
        self.rid, self.model, self.kind = rid, model, kind
        self.tools = tools  # the answer is read for calls of these
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
            # OpenAI's field for the tier that served the request: set under `pricing tiers`.
            "service_tier": clearance.service_tier,
            "auction": clearance.as_json(),
        }

    def whole(self, clearance: Clearance, final: Chunk) -> dict[str, Any]:
        """The non-streamed response."""
        reason = finish_reason(final.meta_info)
        logprobs = self._logprobs(final.meta_info)
        if self.kind == "chat.completion":
            message: dict[str, Any] = {"role": "assistant", "content": final.text}
            if self.tools is not None:
                reason = _read_calls(self.tools, message, reason)
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
        calls: list[dict[str, Any]] = []
        if chunk is not None:
            reason = finish_reason(chunk.meta_info)
            logprobs = self._logprobs(chunk.meta_info)
            if self.tools is None:
                delta, self._sent = chunk.text[self._sent :], len(chunk.text)
            else:
                delta, calls, reason = self._tool_delta(self.tools, chunk.text, reason)
        if self.kind == "chat.completion":
            content: dict[str, Any] = {"content": delta}
            if calls:
                content["tool_calls"] = calls
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

    def _tool_delta(
        self, plan: ToolPlan, text: str, reason: str | None
    ) -> tuple[str, list[dict[str, Any]], str | None]:
        """The content delta, the calls and the finish reason of a streamed answer read for
        calls. Content that cannot be a call goes out as it comes (none under a constraint);
        the rest is held until the answer ends, then sent as calls or, if it is not wholly
        calls, as content."""
        if reason is None:
            end = 0 if plan.constrained else streamable_end(text)
            delta, self._sent = text[self._sent : max(end, self._sent)], max(end, self._sent)
            return delta, [], None
        found = calls_in(plan, text)
        if found is None:
            delta, self._sent = text[self._sent :], len(text)
            return delta, [], reason
        start = 0 if plan.constrained else text.find(CALL_OPEN)
        delta, self._sent = text[self._sent : max(start, self._sent)].rstrip(), len(text)
        calls = [{"index": i, **call} for i, call in enumerate(openai_tool_calls(found[1]))]
        return delta, calls, "tool_calls" if reason == "stop" else reason


def _read_calls(plan: ToolPlan, message: dict[str, Any], reason: str | None) -> str | None:
    """Move the calls in `message`'s content to its `tool_calls`; the finish reason then.

    As SGLang's chat route: an answer that stopped on its own with calls in it finished with
    `tool_calls`; one cut by `max_tokens` keeps `length`."""
    found = calls_in(plan, message["content"])
    if found is None:
        return reason
    message["content"], message["tool_calls"] = found[0], openai_tool_calls(found[1])
    return "tool_calls" if reason == "stop" else reason


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
