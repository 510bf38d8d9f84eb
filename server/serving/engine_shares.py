"""What one user, and free traffic as a whole, may hold of the engine at once.

A request holds one of the engine's `max_inflight` slots and its tokens (prompt plus
`max_new_tokens`, what the engine reserves for it) from the batch that takes it until it ends.
When a batch closes, `select` takes the waiting requests in arrival order, skipping those over
a share; they stay in the pool for a later auction rather than fail:

* zero-bid requests together never hold more than `zero_bid_share` of the slots and of the
  engine's tokens, so free traffic cannot fill the engine ahead of bidders who come later (a
  zero-bid request bigger than that token share alone is refused at admission, by name);
  under `pricing fcfs`, where nobody bids, no request counts as free traffic, and under
  `pricing tiers` a free tier's requests do;
* while another user's request waits, a user holding `user_share` of the slots or tokens or
  more gets no more (a user with nothing at the engine may always start one). Alone, a user
  may take everything: a single tenant is never held back.

The engine's tokens are `engine_tokens` (the embedded emulator's cache when not set); without
either, the shares count slots only.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from inference_auctions.server.engine.contract import DEFAULT_MAX_NEW_TOKENS
from inference_auctions.server.errors import InvalidRequest
from inference_auctions.server.serving.tickets import Ticket
from inference_auctions.server.settings import ServerSettings

__all__ = ["EngineShares", "request_tokens"]


def request_tokens(ticket: Ticket) -> int:
    """What the request holds of the engine's tokens: its prompt and its `max_new_tokens`."""
    asked: Any = ticket.sampling_params.get("max_new_tokens", DEFAULT_MAX_NEW_TOKENS)
    new = asked if isinstance(asked, int) and asked >= 0 else 0
    return len(ticket.tokens) + new


@dataclass
class _Held:
    slots: int = 0
    tokens: int = 0


class EngineShares:
    """The shares of the module docstring, counted from selection to each request's end."""

    def __init__(self, settings: ServerSettings, wake: Callable[[], None]) -> None:
        """`wake`: called when a request's share is released (the pool may take more)."""
        self._wake = wake
        capacity = settings.engine_tokens
        if capacity is None and settings.engine_url is None:
            capacity = settings.emulator_cache_tokens
        slots = settings.max_inflight
        self._user_slots = max(1, math.floor(slots * settings.user_share))
        self._free_slots = max(1, math.floor(slots * settings.zero_bid_share))
        self._user_tokens = None if capacity is None else capacity * settings.user_share
        self._free_tokens = None if capacity is None else capacity * settings.zero_bid_share
        self._users: defaultdict[str, _Held] = defaultdict(_Held)
        self._free = _Held()
        # Under `pricing fcfs` nobody bids: no request is free traffic held to a share.
        self._free_counted = settings.pricing != "fcfs"

    def check(self, ticket: Ticket) -> None:
        """Refuse at admission a zero-bid request that could never fit its share."""
        if ticket.bid_micros or self._free_tokens is None or not self._free_counted:
            return
        tokens = request_tokens(ticket)
        if tokens > self._free_tokens:
            raise InvalidRequest(
                f"a zero-bid request may hold at most {int(self._free_tokens):,} tokens of the "
                f"engine (prompt + max_new_tokens; zero_bid_share); this one asks {tokens:,}: "
                "bid for it, or ask for fewer max_new_tokens",
                param="max_new_tokens",
            )

    def select(self, waiting: Sequence[Ticket], room: int) -> list[int]:
        """The places in `waiting` of the requests a batch of at most `room` takes now."""
        users = {ticket.user for ticket in waiting}
        taken: list[int] = []
        for place, ticket in enumerate(waiting):
            if len(taken) == room:
                break
            tokens = request_tokens(ticket)
            free = self._free_counted and not ticket.bid_micros
            if free and not self._fits(self._free, tokens, free=True):
                continue
            held = self._users[ticket.user]
            contested = len(users) > 1
            if contested and held.slots and not self._fits(held, tokens, free=False):
                continue
            self._take(ticket, tokens)
            taken.append(place)
        return taken

    def _fits(self, held: _Held, tokens: int, *, free: bool) -> bool:
        slots = self._free_slots if free else self._user_slots
        capacity = self._free_tokens if free else self._user_tokens
        if held.slots + 1 > slots:
            return False
        return capacity is None or held.tokens + tokens <= capacity

    def _take(self, ticket: Ticket, tokens: int) -> None:
        held = self._users[ticket.user]
        held.slots += 1
        held.tokens += tokens
        free = self._free_counted and not ticket.bid_micros
        if free:
            self._free.slots += 1
            self._free.tokens += tokens

        def release() -> None:
            held.slots -= 1
            held.tokens -= tokens
            if not held.slots and self._users.get(ticket.user) is held:
                del self._users[ticket.user]
            if free:
                self._free.slots -= 1
                self._free.tokens -= tokens
            self._wake()

        ticket.on_finish.append(release)
