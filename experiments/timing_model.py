"""A discrete-time slot model of the rolling auction, for the study of timing
(`experiments.timing`).

Time runs in engine slots: at every slot the engine starts `S` requests (the emulator's
running-request limit of the live plan), so the plan's arrival rate over `S` is its load. Each
slot runs one clearing through the server's own code (`PoolTree`, `PoolClearing`): the pool's
positive bids ordered by the average-bid DFS, the head of `S` sent, each dispatching user
charged its rolling charge (docs/SPEC.md, section 7).

A request's delay is counted in positions, SPEC section 5's slots: `S` per engine slot waited
since its user needed it, plus its place in its head. A request whose delay reached `K-1`
positions is worth nothing more to its user under section 5's reading of a bid (`b/(K-1)` per
position, for the first `K-1`), so its user withdraws it, uncharged (section 7: a withdrawn
request pays nothing); that also bounds the pool at load above 1.

Three rules price (and for the floor, admit) the dispatched requests:

* `dispatch`: the at-dispatch rolling charge alone (what the server does now);
* `floor`: the same, plus a posted floor in the manner of EIP-1559: only bids at or above it
  enter the auction's pool, entrants pay it at dispatch on top of their rolling charge (capped
  at the bid); the rest wait outside, served in arrival order when no bidder waits; after each
  clearing the floor moves by at most an eighth towards keeping the pool at `floor_target`
  bidders (`server.auction.price_floor.next_floor`, the server's own step);
* `horizon`: the order of `dispatch`, the charge settled after the fact (`experiments.timing`
  computes it by replaying the market without the request).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from inference_auctions.server.auction.batch import TokenArray
from inference_auctions.server.auction.pool_tree import PoolTree

# The server's own step (`price_floor posted`): the study measures the rule the server runs.
from inference_auctions.server.auction.price_floor import next_floor

__all__ = [
    "RULES",
    "Dispatch",
    "MarketConfig",
    "MarketState",
    "SlotMarket",
    "SlotRequest",
    "by_slot",
    "fresh_tokens",
    "next_floor",
]

RULES = ("dispatch", "floor", "horizon")


@dataclass(frozen=True, slots=True)
class MarketConfig:
    """The engine's starts per slot, the priority slots K, and the floor's settings."""

    starts: int
    slots: int
    floor_target: int  # bidders in the pool the floor aims at
    floor_start: int = 0  # micro-credits, the floor's level before any traffic (the server's)
    expire: bool = True  # a request whose value is gone is withdrawn (off: it waits on)

    @property
    def window(self) -> int:
        """Engine slots after which a request is worth nothing even first in its head."""
        return -(-(self.slots - 1) // self.starts)


@dataclass(frozen=True, slots=True)
class SlotRequest:
    """A request as the model sees it: its prompt, bid and true value, the slot its user
    needed it (`needed`, where its delay starts) and the slot it was sent (`arrival`)."""

    rid: str
    user: str
    tokens: TokenArray
    bid: int
    value: int
    needed: int
    arrival: int


@dataclass(frozen=True, slots=True)
class Dispatch:
    """A request sent to the engine: at which slot, at which place in its head, and its share
    of its user's charge for that head (the floor included)."""

    slot: int
    rank: int
    charge: int

    def delay(self, request: SlotRequest, starts: int) -> int:
        """Positions between its user's need and its start."""
        return starts * (self.slot - request.needed) + self.rank


@dataclass(slots=True)
class MarketState:
    """What carries from one slot to the next: the waiting requests (in arrival order, each
    with its arrival sequence number, which breaks the tree's ties) and the floor."""

    waiting: dict[str, tuple[SlotRequest, int]] = field(default_factory=dict)
    floor: int = 0
    sequence: int = 0

    def copy(self) -> MarketState:
        return MarketState(dict(self.waiting), self.floor, self.sequence)


class SlotMarket:
    """The market slot by slot under one rule (`dispatch` and `horizon` clear alike)."""

    def __init__(
        self,
        config: MarketConfig,
        rule: str,
        arrivals: Mapping[int, Sequence[SlotRequest]],
        state: MarketState | None = None,
        *,
        priced: set[str] | None = None,
        tree_tokens: Mapping[str, TokenArray] | None = None,
    ) -> None:
        """`priced`: the users whose charges are computed (None: all); `tree_tokens`: the
        prompt under which a request is filed in the auction's tree, when not its own."""
        if rule not in RULES:
            raise ValueError(f"rule must be one of {', '.join(RULES)}, not {rule!r}")
        self.config = config
        self.rule = rule
        self.arrivals = arrivals
        self.state = state.copy() if state is not None else MarketState(floor=config.floor_start)
        self.priced = priced
        self.tree_tokens = tree_tokens or {}
        self.dispatched: dict[str, Dispatch] = {}
        self.requests: dict[str, SlotRequest] = {}
        self.withdrawn: set[str] = set()
        self.avoid: set[str] = set()  # withdrawn whenever a clearing would send them
        self.charged = 0  # micro-credits charged in all
        self._tree = PoolTree()
        self._in_tree: set[str] = set()
        for request, _ in self.state.waiting.values():
            self.requests[request.rid] = request

    # Requests in and out

    def submit(self, request: SlotRequest) -> None:
        """A request joins the waiting pool now."""
        self.requests[request.rid] = request
        self.state.waiting[request.rid] = (request, self.state.sequence)
        self.state.sequence += 1

    def withdraw(self, rid: str) -> None:
        """A waiting request leaves, uncharged."""
        if self.state.waiting.pop(rid, None) is not None:
            self.withdrawn.add(rid)
            if rid in self._in_tree:
                self._tree.remove(rid)
                self._in_tree.discard(rid)

    def is_waiting(self, rid: str) -> bool:
        return rid in self.state.waiting

    # One slot

    def step(self, slot: int) -> list[str]:
        """Arrivals, withdrawals of the expired, one clearing; the rids sent, in order."""
        for request in self.arrivals.get(slot, ()):
            self.submit(request)
        limit = self.config.slots - 1
        for rid, (request, _) in list(self.state.waiting.items()):
            expired = self.config.starts * (slot - request.needed) >= limit
            if self.config.expire and expired and rid not in self.avoid:
                self.withdraw(rid)
        while True:
            head, depth = self._head()
            unwanted = [rid for rid in head if rid in self.avoid]
            if not unwanted:
                break
            for rid in unwanted:
                self.withdraw(rid)
        self._send(slot, head)
        if self.rule == "floor":
            self.state.floor = next_floor(self.state.floor, depth, self.config.floor_target)
        return head

    def run(self, start: int, stop: int) -> None:
        for slot in range(start, stop):
            self.step(slot)

    def _entrant(self, request: SlotRequest) -> bool:
        return request.bid >= (max(1, self.state.floor) if self.rule == "floor" else 1)

    def _head(self) -> tuple[list[str], int]:
        """The head the engine starts now and the pool's depth (its bidders)."""
        self._follow()
        head: list[str] = []
        for rid in self._tree.clearing().service_order():
            if len(head) == self.config.starts:
                break
            head.append(rid)
        if len(head) < self.config.starts:
            for rid in self.state.waiting:
                if len(head) == self.config.starts:
                    break
                if rid not in self._in_tree:
                    head.append(rid)
        return head, len(self._in_tree)

    def _follow(self) -> None:
        """Bring the auction's tree in step with the waiting entrants."""
        tree = self._tree
        for rid, (request, sequence) in self.state.waiting.items():
            enters = self._entrant(request)
            if enters and rid not in self._in_tree:
                tokens = self.tree_tokens.get(rid, request.tokens)
                tree.insert(rid, request.user, tokens, request.bid, sequence)
                self._in_tree.add(rid)
            elif not enters and rid in self._in_tree:
                tree.remove(rid)
                self._in_tree.discard(rid)

    def _send(self, slot: int, head: list[str]) -> None:
        bidders = [rid for rid in head if rid in self._in_tree]
        charges = self._charges(bidders, {rid: rank for rank, rid in enumerate(head)}, slot)
        for rank, rid in enumerate(head):
            del self.state.waiting[rid]
            self.dispatched[rid] = Dispatch(slot, rank, charges.get(rid, 0))
        for rid in bidders:
            self._tree.remove(rid)
            self._in_tree.discard(rid)

    def _charges(self, bidders: list[str], ranks: dict[str, int], slot: int) -> dict[str, int]:
        """Each sent bidder's share of its user's charge, split in proportion to the bids:
        the rolling charge capped at the bids (`dispatch`, as the server); under `floor`, the
        rolling charge plus the floor, capped at what the bids say the delays they got are
        worth (a truthful user never pays more than its value for its delay)."""
        if not bidders:
            return {}
        users: dict[str, list[str]] = {}
        for rid in bidders:
            user = self.state.waiting[rid][0].user
            if self.priced is None or user in self.priced:
                users.setdefault(user, []).append(rid)
        priced = [rid for mine in users.values() for rid in mine]
        if not priced:
            return {}
        rolling = self._tree.clearing().charges(priced, self.config.slots)
        floor = self.state.floor if self.rule == "floor" else 0
        shares: dict[str, int] = {}
        for user, mine in users.items():
            bids = [self.state.waiting[rid][0].bid for rid in mine]
            cap = sum(bids)
            if self.rule == "floor":
                cap = sum(self._worth(rid, ranks[rid], slot) for rid in mine)
            total = min(rolling[user] + floor * len(mine), cap)
            self.charged += total
            given = 0
            for rid, bid in zip(mine, bids, strict=True):
                shares[rid] = total * bid // sum(bids)
                given += shares[rid]
            shares[mine[0]] += total - given
        return shares

    def _worth(self, rid: str, rank: int, slot: int) -> int:
        """What the request's bid says being sent now is worth (SPEC section 5's reading)."""
        request = self.state.waiting[rid][0]
        delay = Dispatch(slot, rank, 0).delay(request, self.config.starts)
        last = self.config.slots - 1
        return request.bid * max(0, last - delay) // last


def by_slot(requests: Iterable[SlotRequest]) -> dict[int, list[SlotRequest]]:
    """Requests grouped by the slot they are sent, in their given order."""
    grouped: dict[int, list[SlotRequest]] = {}
    for request in requests:
        grouped.setdefault(request.arrival, []).append(request)
    return grouped


def fresh_tokens(start: int, count: int) -> TokenArray:
    """Token ids that no plan prompt uses."""
    return np.arange(start, start + count, dtype=np.int64)
