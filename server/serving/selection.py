"""Which waiting requests the next batch takes, in what order, and what prices them.

Under `scheduling rolling` (the default) every clearing looks at the whole waiting pool:

* `auction`: the positive bids are ordered by the average-bid DFS of their radix tree
  (`server.auction.rolling`); zero bids wait outside the auction (they would move no average)
  and come after every bidder, in arrival order, within `zero_bid_share`;
* `tiers`: dearest tier first, first come first served within one; `fcfs`: arrival order.

The batch is the head of that order that the engine can start at its next step: at most the
pool's room in requests (`BatchPool`), and prompts up to the engine's prefill budget
(`token_room`); requests over a user's or free traffic's share are passed over and wait
(`EngineShares`). What is left competes again, with later arrivals, at the next clearing. The
auction's head goes to the closing with the pool's order (`PoolPricing`), which its charges read.

Under `scheduling batches` (the earlier behaviour, kept for comparison) a batch is the oldest
waiting requests (dearest tier first under `tiers`), up to the room, whatever they bid.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from inference_auctions.server.auction import AuctionRequest
from inference_auctions.server.auction.rolling import PoolOrder, order_pool
from inference_auctions.server.serving.pool import EngineShares, Selection
from inference_auctions.server.serving.tickets import Ticket
from inference_auctions.server.settings import ServerSettings

__all__ = ["PoolPricing", "PoolSelector"]


@dataclass(frozen=True, slots=True)
class PoolPricing:
    """The pool a rolling auction's head was taken from: its order, and each head request that
    bid (ledger rid -> its index in `pool.requests`)."""

    pool: PoolOrder
    dispatched: dict[str, int]


class PoolSelector:
    """The pool's `select` (see the module docstring)."""

    def __init__(
        self,
        settings: ServerSettings,
        shares: EngineShares,
        token_room: Callable[[], int | None],
    ) -> None:
        """`token_room`: prompt tokens the engine can still start at its next step (None: no
        bound)."""
        self._mode = settings.pricing
        self._rolling = settings.scheduling == "rolling"
        self._shares = shares
        self._token_room = token_room

    def __call__(self, waiting: list[Ticket], room: int) -> Selection[PoolPricing]:
        if self._mode == "auction" and self._rolling:
            return self._auction(waiting, room)
        order = list(range(len(waiting)))
        if self._mode == "tiers":
            order.sort(key=lambda place: -waiting[place].bid_micros)  # stable: arrival within
        token_room = self._token_room() if self._rolling else None
        chosen = self._shares.select([waiting[place] for place in order], room, token_room)
        return Selection([order[index] for index in chosen])

    def _auction(self, waiting: list[Ticket], room: int) -> Selection[PoolPricing]:
        bidders = [place for place, ticket in enumerate(waiting) if ticket.bid_micros > 0]
        pool = order_pool(
            [
                AuctionRequest(ticket.ledger_rid, ticket.user, ticket.tokens, ticket.bid_micros)
                for ticket in (waiting[place] for place in bidders)
            ]
        )
        free = [place for place, ticket in enumerate(waiting) if ticket.bid_micros <= 0]
        order = [bidders[index] for index in pool.order] + free
        chosen = self._shares.select([waiting[place] for place in order], room, self._token_room())
        places = [order[index] for index in chosen]
        pool_index = {place: index for index, place in enumerate(bidders)}
        dispatched = {
            waiting[place].ledger_rid: pool_index[place] for place in places if place in pool_index
        }
        return Selection(places, PoolPricing(pool, dispatched))
