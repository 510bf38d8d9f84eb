"""Which waiting requests the next batch takes, in what order, and what prices them.

Under `scheduling rolling` (the default) every clearing looks at the whole waiting pool:

* `auction`: the positive bids are ordered by the average-bid DFS of their radix tree
  (`server.auction.rolling`); zero bids wait outside the auction (they would move no average)
  and come after every bidder, in arrival order, within `zero_bid_share`;
* `tiers`: dearest tier first, first come first served within one; `fcfs`: arrival order.

A request whose prompt starts with a prefix the engine holds (`ResidentPrefixes`) is filed in
the tree without it: the DFS keeps a prefix's requests together to save its prefill, which a
cached prefix no longer costs.

Free requests (a zero bid, a free tier) go, under `free_traffic idle` (the default), only
while no paying request is at the engine or goes in the same clearing: SGLang runs a new
prefill before its next decode step, so a free long prompt sent beside paying requests would
stall their decoding however they bid. Under `free_traffic shared` they take what the engine
has left after the bidders, within `zero_bid_share`.

The batch is the head of that order that the engine can start at its next step: at most the
pool's room in requests (`BatchPool`), and prompts up to the engine's prefill budget
(`token_room`); requests over a user's or free traffic's share are passed over and wait
(`EngineShares`). What is left competes again, with later arrivals, at the next clearing. The
auction's head goes to the closing priced against the pool (`HeadPricing`): its charges are
computed at selection, on the tree as it stood.

Under `price_floor posted` (`server.auction.price_floor`) only the bids at or above the floor
enter the tree; the bids below it wait outside and go, in arrival order, only when no entrant
is left waiting, before the free requests; the entrants sent pay the floor besides their charge,
and the floor takes its step after every clearing.

Under `scheduling batches` (the earlier behaviour, kept for comparison) a batch is the oldest
waiting requests (dearest tier first under `tiers`), up to the room, whatever they bid.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

import numpy as np

from inference_auctions.server.auction.batch import TokenArray
from inference_auctions.server.auction.pool_tree import PoolTree
from inference_auctions.server.auction.price_floor import PostedFloor, price_entrants
from inference_auctions.server.auction.rolling import HeadPricing
from inference_auctions.server.engine.protocol import TokenIds
from inference_auctions.server.serving.clearing_log import ClearingLog
from inference_auctions.server.serving.pool import EngineShares, Selection
from inference_auctions.server.serving.resident_prefixes import ResidentPrefixes
from inference_auctions.server.serving.tickets import Ticket
from inference_auctions.server.settings import ServerSettings

__all__ = ["PoolSelector"]


class PoolSelector:
    """The pool's `select` (see the module docstring). Under the rolling auction it keeps the
    pool's radix tree (`PoolTree`) in step with the waiting requests, changing only what
    joined or left since the last clearing."""

    def __init__(
        self,
        settings: ServerSettings,
        shares: EngineShares,
        token_room: Callable[[], int | None],
        paying_at_engine: Callable[[], int] = lambda: 0,
        log: ClearingLog | None = None,
        resident: ResidentPrefixes | None = None,
        floor: PostedFloor | None = None,
    ) -> None:
        """`token_room`: prompt tokens the engine can still start at its next step (None: no
        bound); `paying_at_engine`: how many requests that pay are at the engine now;
        `resident`: the prefixes the engine holds (None: every prefix keeps its requests
        together); `floor`: the posted price floor (None: `price_floor off`)."""
        self._mode = settings.pricing
        self._rolling = settings.scheduling == "rolling"
        # Free requests go only while nothing that pays is at the engine (`free_traffic`).
        self._free_waits = (
            self._rolling and settings.free_traffic == "idle" and settings.pricing != "fcfs"
        )
        self._paying_at_engine = paying_at_engine
        self._log = log  # every clearing's pool, head and charges (`clearing_log`)
        self._slots = settings.priority_slots or settings.batch_size
        self._shares = shares
        self._token_room = token_room
        self._tree = PoolTree()
        self._resident = resident
        self._arrivals = 0  # orders ties in the tree: earlier arrival first
        self.floor = floor if self._mode == "auction" and self._rolling else None

    def __call__(self, waiting: list[Ticket], room: int) -> Selection[HeadPricing]:
        if self._mode == "auction" and self._rolling:
            return self._auction(waiting, room)
        order = list(range(len(waiting)))
        if self._mode == "tiers":
            order.sort(key=lambda place: -waiting[place].bid_micros)  # stable: arrival within
        if not self._rolling:
            chosen = self._shares.select([waiting[place] for place in order], room)
            return Selection([order[index] for index in chosen])
        paying = [place for place in order if waiting[place].bid_micros > 0]
        free = [place for place in order if waiting[place].bid_micros <= 0]
        if self._mode == "fcfs":  # nobody pays: everyone in arrival order
            paying, free = order, []
        contested = len({ticket.user for ticket in waiting}) > 1
        chosen = self._shares.select(
            [waiting[place] for place in paying], room, self._token_room(), contested=contested
        )
        places = [paying[index] for index in chosen]
        return Selection(places + self._free_head(waiting, free, places, room, contested))

    def _free_head(
        self, waiting: list[Ticket], free: list[int], taken: list[int], room: int, contested: bool
    ) -> list[int]:
        """What of the free requests (`free`, in order) goes now, after the paying ones
        `taken`: under `free_traffic idle`, nothing while a paying request is at the engine or
        goes now, since a free prompt's prefill would stall its decoding."""
        if not free or len(taken) >= room:
            return []
        if self._free_waits and (taken or self._paying_at_engine() > 0):
            return []
        return self._fill(waiting, free, taken, room, contested)

    def _fill(
        self, waiting: list[Ticket], more: list[int], taken: list[int], room: int, contested: bool
    ) -> list[int]:
        """What of `more` (places, in order) fits the room and prompt tokens `taken` left."""
        if not more or len(taken) >= room:
            return []
        token_room = self._token_room()
        if token_room is not None:
            token_room -= sum(len(waiting[place].tokens) for place in taken)
            if token_room <= 0:
                return []
        chosen = self._shares.select(
            [waiting[place] for place in more], room - len(taken), token_room, contested=contested
        )
        return [more[index] for index in chosen]

    def _auction(self, waiting: list[Ticket], room: int) -> Selection[HeadPricing]:
        floor = self.floor
        if (
            len(waiting) == 1
            and not self._tree
            and waiting[0].bid_micros > 0
            and (floor is None or floor.micros == 0)
        ):
            return self._alone(waiting[0], room)
        place_of = self._follow(waiting, 1 if floor is None else floor.entry)
        clearing = self._tree.clearing()
        candidates: list[int] = []

        def in_order() -> Iterator[Ticket]:
            for rid in clearing.service_order():
                candidates.append(place_of[rid])
                yield waiting[place_of[rid]]

        contested = len({ticket.user for ticket in waiting}) > 1
        chosen = self._shares.select(in_order(), room, self._token_room(), contested=contested)
        places = [candidates[index] for index in chosen]
        head = [waiting[place] for place in places]
        outside: list[int] = []
        if floor is not None:
            outside = [p for p, t in enumerate(waiting) if 0 < t.bid_micros < floor.entry]
            if len(places) == len(place_of):  # no entrant is left waiting: they may go
                places += self._fill(waiting, outside, places, room, contested)
        free = [place for place, ticket in enumerate(waiting) if ticket.bid_micros <= 0]
        places += self._free_head(waiting, free, places, room, contested)
        rids = [ticket.ledger_rid for ticket in head]
        users = {ticket.ledger_rid: ticket.user for ticket in head}
        bids = {ticket.ledger_rid: ticket.bid_micros for ticket in head}
        charges = clearing.charges(rids, self._slots)
        floors: dict[str, int] = {}
        if floor is not None:
            priced = price_entrants(
                rids, users, floor.worth(rids, bids, self._slots), charges, floor.micros
            )
            charges, floors = priced.charges, priced.floors
        pricing = HeadPricing(order=rids, users=users, bids=bids, charges=charges, floors=floors)
        # A clearing that sends no bidder prices nothing; under a floor it still moves the
        # floor, and its line (an empty head) keeps the floor's every step in the log.
        if self._log is not None and (rids or floor is not None):
            level = None if floor is None else floor.micros
            self._log.write(self._slots, clearing.pool(), rids, pricing.charges, level, floors)
        sent = [waiting[place] for place in places]
        self._sent(sent)
        if floor is not None:
            floor.cleared(len(place_of), len(outside), [ticket.ledger_rid for ticket in sent])
        return Selection(places, pricing)

    def _alone(self, ticket: Ticket, room: int) -> Selection[HeadPricing]:
        """A lone bidder in an empty pool, under no floor or a floor at zero: it delays nobody
        and pays 0, without the tree."""
        floor, rid = self.floor, ticket.ledger_rid
        if floor is not None:
            floor.observe([rid])
        if not self._shares.select([ticket], room, self._token_room(), contested=False):
            return Selection([], None)
        pricing = HeadPricing(
            order=[rid],
            users={rid: ticket.user},
            bids={rid: ticket.bid_micros},
            charges={ticket.user: 0},
            floors={} if floor is None else {rid: 0},
        )
        if self._log is not None:
            pool = [{"rid": rid, "user": ticket.user, "bid": ticket.bid_micros, "path": []}]
            level, floors = (None, None) if floor is None else (0, pricing.floors)
            self._log.write(self._slots, pool, [rid], pricing.charges, level, floors)
        self._sent([ticket])
        if floor is not None:
            floor.cleared(1, 0, [rid])  # one entrant, at most the target: the floor stays 0
        return Selection([0], pricing)

    def _sent(self, tickets: Iterable[Ticket]) -> None:
        """Requests on their way to the engine: their prompts' prefixes become resident."""
        if self._resident is not None:
            for ticket in tickets:
                self._resident.record(_array(ticket.tokens))

    def _follow(self, waiting: list[Ticket], minimum: int) -> dict[str, int]:
        """Bring the tree in step with the waiting bids of at least `minimum` (1, or the posted
        floor: a request below it waits outside, and enters once the floor falls to its bid);
        each one's place in `waiting`."""
        if self.floor is not None:
            self.floor.observe([t.ledger_rid for t in waiting if t.bid_micros > 0])
        place_of = {
            ticket.ledger_rid: place
            for place, ticket in enumerate(waiting)
            if ticket.bid_micros >= minimum
        }
        tree = self._tree
        for rid in tree.rids() - place_of.keys():
            tree.remove(rid)
        for rid, place in place_of.items():  # in arrival order
            if rid not in tree:
                ticket = waiting[place]
                tree.insert(rid, ticket.user, self._key(ticket), ticket.bid_micros, self._arrivals)
                self._arrivals += 1
        return place_of

    def _key(self, ticket: Ticket) -> TokenArray:
        """The request's path in the tree: its prompt, or, when the prompt starts with a
        prefix the engine holds, a marker of its own followed by the rest. The cached prefix
        costs no prefill, so its requests need not go together; filed under it, a valuable
        request would go only when the whole prefix's average bid wins, and a stream of
        higher-average subtrees could hold it back for as long as it lasts."""
        tokens = _array(ticket.tokens)
        resident = 0 if self._resident is None else self._resident.resident_length(tokens)
        if not resident:
            return tokens
        # Token ids are never negative: the marker shares no edge with any other path.
        marker = np.array([-1 - self._arrivals], dtype=np.int64)
        return np.concatenate((marker, tokens[resident:]))


def _array(tokens: TokenIds) -> TokenArray:
    """The prompt as an array (the server's tokens already are one: no copy)."""
    return tokens if isinstance(tokens, np.ndarray) else np.asarray(tokens, dtype=np.int64)
