"""What every generation endpoint shares: limits, the pricing fields, admission and waiting.

The endpoints differ only in how they read a body and how they render the engine's chunks
(SGLang-native or OpenAI-shaped); both hand the service one `Admission` (`admission_of`), then
`complete` or `stream`.

What a request's pricing fields say under the server's pricing mode: its bid, or its tier.

Every mode reads both `bid` and `service_tier` (OpenAI's field) and returns the amount the
request is admitted at, which its hold covers and the ledger records as its `bid_micros`:

* `auction`: the bid. A `service_tier` other than `auto` is refused by name: priority here is
  bought with a bid.
* `tiers`: the price of the tier named (none, or `auto`: the default tier). An unknown tier is
  refused by name, listing the tiers; so is a bid above 0, since a tier's price is fixed and a
  bid would buy nothing.
* `fcfs`: 0. A bid is ignored (the response's `auction.pricing` says `fcfs` and its
  `bid_micros` is 0); a `service_tier` other than `auto` is refused by name.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np
from fastapi import Request
from fastapi.responses import StreamingResponse

from inference_auctions.billing import MICROS_PER_CREDIT, InvalidAmount, UserInfo, parse_credits
from inference_auctions.server.api.connections import disconnect_notice
from inference_auctions.server.api.deps import AppState
from inference_auctions.server.api.json_response import sse_event
from inference_auctions.server.engine.errors import ChatRefused, EngineError, EngineTimeout
from inference_auctions.server.engine.protocol import TokenArray
from inference_auctions.server.errors import (
    EngineFailed,
    EngineTimedOut,
    InvalidRequest,
    ServiceError,
    Unavailable,
)
from inference_auctions.server.serving.admission import Admission, payload_fingerprint
from inference_auctions.server.serving.dispatch import client_left
from inference_auctions.server.serving.service import AuctionService
from inference_auctions.server.serving.tickets import Chunk, Clearance, Ticket
from inference_auctions.server.serving.tiers import AUTO, TierMenu

__all__ = [
    "ToolChat",
    "admission_amount",
    "admission_of",
    "check_max_new_tokens",
    "complete",
    "new_rid",
    "prompt_tokens",
    "stream",
]

_DONE = b"data: [DONE]\n\n"
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def parse_bid(value: Any, state: AppState) -> int:
    """The bid in micro-credits: non-negative, finite, at most 6 decimals, under the limit."""
    limit = state.settings.max_bid_credits * MICROS_PER_CREDIT
    if isinstance(value, float):  # only reachable if a caller bypassed the exact JSON reader
        value = repr(value)
    try:
        return parse_credits(value, "bid", maximum=limit)
    except InvalidAmount as error:
        raise InvalidRequest(str(error), param="bid") from None


@dataclass(frozen=True)
class ToolChat:
    """A chat with tools offered or tool calls in it, as its chat template is to see it."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None


async def prompt_tokens(
    state: AppState,
    text: str | None,
    input_ids: list[int] | None,
    field: str,
    messages: list[tuple[str, str]] | ToolChat | None = None,
) -> TokenArray:
    """Token ids of the prompt (tokenized by the engine, cached), within the size limits; a
    chat's (`messages`, `text` their plain rendering) as the engine's chat template renders
    them. A chat with tools the engine will not render is the client's 400, naming `tools`
    (or `messages`, when only its history holds tool calls)."""
    settings = state.settings
    if text is None and input_ids is None:
        raise InvalidRequest(
            f"{field} is missing: send the prompt as '{field}' (a string) "
            "or as 'input_ids' (a list of token ids)",
            param=field,
        )
    if text is not None and input_ids is not None:
        raise InvalidRequest(f"send either '{field}' or 'input_ids', not both", param=field)
    if text is not None:
        if len(text) > settings.max_prompt_chars:
            raise InvalidRequest(
                f"{field}: {len(text):,} characters; the limit is {settings.max_prompt_chars:,}",
                param=field,
            )
        tokens = await _text_tokens(state, text, messages)
    else:
        assert input_ids is not None
        tokens = _token_array(input_ids)
        # The ids came in `input_ids` (`/generate`) or as the OpenAI `prompt` itself.
        await _check_vocabulary(state, tokens, "input_ids" if field == "text" else field)
    if len(tokens) == 0:
        raise InvalidRequest(f"{field}: the prompt is empty", param=field)
    if len(tokens) > settings.max_prompt_tokens:
        raise InvalidRequest(
            f"{field}: {len(tokens):,} tokens; the limit is {settings.max_prompt_tokens:,}",
            param=field,
        )
    return tokens


async def _text_tokens(
    state: AppState, text: str, messages: list[tuple[str, str]] | ToolChat | None
) -> TokenArray:
    """The engine's ids of a prompt, or of a chat in its template; its failures as ours."""
    try:
        if messages is None:
            return await state.service.tokenize(text)
        if isinstance(messages, ToolChat):
            return await state.service.tokenize_tool_chat(messages.messages, messages.tools)
        return await state.service.tokenize_chat(messages)
    except ChatRefused as error:
        param = "tools" if isinstance(messages, ToolChat) and messages.tools else "messages"
        raise InvalidRequest(f"{param}: {error}", param=param) from None
    except EngineTimeout as error:
        raise EngineTimedOut(f"tokenizing the prompt timed out: {error}") from None
    except EngineError as error:
        raise EngineFailed(f"the engine could not tokenize the prompt: {error}") from None


async def _check_vocabulary(state: AppState, tokens: TokenArray, field: str) -> None:
    """Refuse ids the model has no embedding for: one kills SGLang's scheduler, and with it
    every request it holds (`server.engine.vocabulary`)."""
    vocab_size = await state.service.vocab_size()
    if vocab_size is None or len(tokens) == 0 or int(tokens.max()) < vocab_size:
        return
    bad = int(tokens[tokens >= vocab_size][0])
    raise InvalidRequest(
        f"{field}: token id {bad:,} is outside the model's vocabulary "
        f"(ids 0 to {vocab_size - 1:,})",
        param=field,
    )


def _token_array(input_ids: list[int]) -> TokenArray:
    """The client's ids as an array (the schema bounds each id to [0, 2**31))."""
    array = np.asarray(input_ids, dtype=np.int32)
    array.flags.writeable = False
    return array


def check_max_new_tokens(value: int, state: AppState, field: str) -> None:
    """Refuse a generation length above the server's limit."""
    limit = state.settings.max_new_tokens_limit
    if value > limit:
        raise InvalidRequest(f"{field}: {value:,} is above the limit of {limit:,}", param=field)


def new_rid() -> str:
    """A fresh rid: 32 hex digits, a millisecond clock (48 bits) then 80 random bits.

    Ordered by time, like a UUIDv7, because the ledger keys rows by rid (the hold, the
    request's record, the hold's and release's idempotency keys): rids that grow insert at the
    right edge of those indexes, so a group commit dirties a few pages there, where random
    rids would dirty a page per request and index (and, on a ledger larger than its cache,
    read it first). The random part keeps rids unguessable and unique across replicas.
    """
    return f"{time.time_ns() // 1_000_000:012x}{os.urandom(10).hex()}"


def admission_of(
    user: UserInfo,
    rid: str | None,
    tokens: TokenArray,
    bid_micros: int,
    sampling_params: dict[str, Any],
    payload: dict[str, Any],
    *,
    streamed: bool,
) -> Admission:
    """What the route hands the service: the client's rid, or a fresh one when it sent none."""
    return Admission(
        user=user.name,
        rid=rid or new_rid(),
        tokens=tokens,
        bid_micros=bid_micros,
        sampling_params=sampling_params,
        fingerprint=payload_fingerprint(payload),
        streamed=streamed,
    )


async def complete(
    request: Request, service: AuctionService, ticket: Ticket
) -> tuple[Clearance, Chunk]:
    """Wait for the whole output (its clearance comes before it); a client that leaves before
    its batch closed frees its hold, one that leaves later stops its work."""
    ticket.waiters += 1
    try:
        await _done_unless_gone(request, service, ticket)
        return ticket.cleared(), await ticket.result()
    finally:
        ticket.waiters -= 1
        client_left(ticket)  # a no-op unless it left before the end


async def _done_unless_gone(request: Request, service: AuctionService, ticket: Ticket) -> None:
    """Wait for the end of the request, one wait in all (the clearance is not awaited apart:
    the handler has nothing to do with it before the end); a client that leaves first frees
    its hold or stops its work."""
    done = ticket.when_done()
    if done.done():
        return
    # This reader's own future fails if the client leaves first; the handler awaits that
    # future directly (no second task, no `wait`).
    stop_watching = _fail_when_gone(request, done)
    try:
        await done
    except _ClientLeft:
        if ticket.clearance is None:
            if ticket.waiters <= 1:
                await service.abandon(ticket)
            raise Unavailable("the client disconnected before its batch closed") from None
        raise Unavailable("the client disconnected before its answer was complete") from None
    finally:
        stop_watching()


class _ClientLeft(Exception):
    """The client disconnected (or its connection could no longer be read) before clearance."""


def _fail_when_gone(request: Request, waiting: asyncio.Future[None]) -> Callable[[], None]:
    """Fail `waiting` with `_ClientLeft` if the client's connection is lost first; returns
    what stops watching. Under the server's own protocol the connection says so itself
    (`DisconnectNotice`); under another ASGI server, a task reads `receive()` until the
    disconnect."""

    def gone() -> None:
        if not waiting.done():  # once the ticket resolved it, a no-op
            waiting.set_exception(_ClientLeft())

    notice = disconnect_notice(request.scope)
    if notice is not None:
        notice.add(gone)
        return partial(notice.discard, gone)
    watch = asyncio.ensure_future(_read_until_gone(request, gone))

    def stop_watching() -> None:
        watch.cancel()

    return stop_watching


async def _read_until_gone(request: Request, gone: Callable[[], None]) -> None:
    try:
        while (await request.receive())["type"] != "http.disconnect":
            pass
    finally:
        # Also when reading failed or this watch was cancelled from outside: as before, the
        # request then counts as left.
        gone()


Render = Callable[[Clearance, Chunk | None], dict[str, Any]]


def stream(service: AuctionService, ticket: Ticket, render: Render) -> StreamingResponse:
    """Server-sent events: the auction object first, as soon as the batch clears, then the
    chunks, then `[DONE]`; an error mid-stream is an `error` event before `[DONE]`."""
    return StreamingResponse(
        _events(service, ticket, render), media_type="text/event-stream", headers=SSE_HEADERS
    )


async def _events(service: AuctionService, ticket: Ticket, render: Render) -> AsyncIterator[bytes]:
    ticket.waiters += 1
    try:
        try:
            clearance = await ticket.wait_cleared()
        except ServiceError as error:
            yield sse_event(error.body())
            yield _DONE
            return
        yield sse_event(render(clearance, None))
        try:
            async for chunk in ticket.follow():
                yield sse_event(render(clearance, chunk))
        except ServiceError as error:
            yield sse_event(error.body())
        yield _DONE
    finally:
        ticket.waiters -= 1
        if ticket.clearance is None and ticket.waiters == 0:
            # The client left before its batch closed; shielded so the hold is surely freed.
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.shield(service.abandon(ticket))
        else:
            client_left(ticket)  # a no-op unless it left before the end


def admission_amount(state: AppState, bid_value: Any, tier_value: Any) -> int:
    """The micro-credits the request is admitted at (see the module docstring)."""
    settings = state.settings
    bid = parse_bid(bid_value, state)  # checked in every mode: a malformed bid is an error
    if settings.pricing == "tiers":
        menu = state.service.tier_menu
        assert menu is not None  # the service builds it in this mode
        if bid:
            raise InvalidRequest(
                "bid: this server sells fixed-price tiers, not bids; choose one with "
                f"service_tier ({_choices(menu)}) and leave bid out (or 0)",
                param="bid",
            )
        return _tier_price(menu, tier_value)
    if tier_value is not None and tier_value != AUTO:
        what = (
            "an auction: priority is bought with a bid"
            if settings.pricing == "auction"
            else ("first come, first served: every request has the same priority")
        )
        raise InvalidRequest(
            f"service_tier: this server runs {what}; leave service_tier out (or 'auto')",
            param="service_tier",
        )
    return 0 if settings.pricing == "fcfs" else bid


def _tier_price(menu: TierMenu, value: Any) -> int:
    if value is not None and not isinstance(value, str):
        raise InvalidRequest(
            f"service_tier: expected a tier's name, got {type(value).__name__}",
            param="service_tier",
        )
    tier = menu.named(value)
    if tier is None:
        raise InvalidRequest(
            f"service_tier: {value!r} is not a tier of this server; choose one of "
            f"{_choices(menu)}, or 'auto' for the default ({menu.default.name})",
            param="service_tier",
        )
    return tier.price_micros


def _choices(menu: TierMenu) -> str:
    return ", ".join(f"{tier.name!r}" for tier in menu.tiers)
