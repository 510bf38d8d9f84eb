"""The rolling auction's posted price floor (docs/SPEC.md section 7, "The price floor").

Under `price_floor posted` a waiting request enters the auction's pool only while its bid is at
least the floor; the others wait outside with the zero bids and go, in arrival order, only into
room no entrant is left to take, paying nothing. An entrant dispatched pays the floor on top of
its rolling charge, the two together never more than what its bid says the delay it got is
worth. After every clearing the floor moves by EIP-1559's step towards keeping as many
entrants in the pool as the engine starts at its next step (`docs/dev/2026-12-07-timing-rules.md`
chose the rule; `experiments.timing_model` measures it with this `next_floor`).

* `next_floor`: the step, a pure function (the study and the server share it);
* `delay_worth` and `price_entrants`: what a dispatched user pays of the floor and of its
  rolling charge;
* `PostedFloor`: one server's floor and what it needs to price a delay (engine starts since
  each request was first seen). Each replica keeps its own.

No I/O, no clock; money is whole micro-credits.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass

__all__ = ["PostedFloor", "delay_worth", "next_floor", "price_entrants"]


def next_floor(floor: int, depth: int, target: int) -> int:
    """EIP-1559's step: up while the pool holds more entrants (`depth`) than `target`, down
    while fewer, by at most an eighth of the level (at least one micro-credit) per clearing;
    never below zero. At zero every positive bid enters: an engine that keeps up charges no
    floor."""
    gap = max(-target, min(target, depth - target))
    if gap == 0:
        return floor
    step = max(1, floor * abs(gap) // (8 * target))
    return max(0, floor + step if gap > 0 else floor - step)


def delay_worth(bid: int, delay: int, slots: int) -> int:
    """What a bid says being started after `delay` positions is worth: `b*(K-1-d)//(K-1)`
    (SPEC section 5: a bid buys `K-1` positions, `b/(K-1)` each)."""
    last = slots - 1
    if last <= 0:
        return bid if delay <= 0 else 0
    return bid * max(0, last - delay) // last


@dataclass(frozen=True, slots=True)
class EntrantPrices:
    """Each dispatching user's rolling charge after the cap, and each entrant's floor part."""

    charges: dict[str, int]
    floors: dict[str, int]


def price_entrants(
    order: Sequence[str],
    users: Mapping[str, str],
    worth: Mapping[str, int],
    charges: Mapping[str, int],
    floor: int,
) -> EntrantPrices:
    """User u, whose entrants sent are `D_u`, worth `W` together at their places, pays each
    request's floor part, `min(floor, its worth)`, and its rolling charge up to what is left of
    `W`: `min(rolling charge + sum of the floor parts, W)`. While every request's worth covers
    the floor that is the timing study's `min(rolling charge + floor * n, W)`; a request that
    waited so long that its worth fell below the floor pays only that worth of it, so no part
    ever exceeds the posted floor, and a failed request gets exactly its own part back."""
    mine: dict[str, list[str]] = {}
    for rid in order:
        mine.setdefault(users[rid], []).append(rid)
    capped: dict[str, int] = {}
    floors: dict[str, int] = {}
    for user, rids in mine.items():
        parts = {rid: min(floor, worth[rid]) for rid in rids}
        floors.update(parts)
        left = sum(worth[rid] for rid in rids) - sum(parts.values())
        capped[user] = min(charges.get(user, 0), left)
    return EntrantPrices(capped, floors)


class PostedFloor:
    """One server's posted floor (see the module docstring). `target`: the entrants the floor
    aims at, read at every clearing (by default what the engine can start at its next step,
    which the server learns from the engine)."""

    def __init__(self, start: int, target: Callable[[], int]) -> None:
        self.micros = max(0, start)
        self._target = target
        # Engine starts: requests this server sent, counted so that a request's delay is the
        # sends since it was first seen plus its place in its head (SPEC section 5's slots).
        self._sent = 0
        self._seen: dict[str, int] = {}
        self.entrants = 0  # in the pool at the last clearing
        self.outside = 0  # waiting below the floor at the last clearing

    @property
    def target(self) -> int:
        """The entrants the floor aims at now (at least one)."""
        return max(1, self._target())

    @property
    def entry(self) -> int:
        """The least bid that enters the auction's pool now (a zero bid never does)."""
        return max(1, self.micros)

    def admits(self, bid: int) -> bool:
        """Whether a bid enters the auction's pool now."""
        return bid >= self.entry

    def observe(self, rids: Collection[str]) -> None:
        """The positive bids waiting at a clearing: each new one is stamped with the sends so
        far, where its delay starts."""
        seen, sent = self._seen, self._sent
        for rid in rids:
            if rid not in seen:
                seen[rid] = sent
        if len(seen) > 2 * len(rids) + 64:  # requests withdrawn while waiting: forget them
            self._seen = {rid: seen[rid] for rid in rids}

    def worth(self, order: Sequence[str], bids: Mapping[str, int], slots: int) -> dict[str, int]:
        """What each entrant of a head (in its order) is worth at its place in it."""
        sent = self._sent
        return {
            rid: delay_worth(bids[rid], sent - self._seen.get(rid, sent) + rank, slots)
            for rank, rid in enumerate(order)
        }

    def cleared(self, entrants: int, outside: int, sent: Sequence[str]) -> None:
        """After a clearing: `entrants` were in the pool, `outside` waited below the floor, and
        `sent` went to the engine; the floor takes its step."""
        self.entrants, self.outside = entrants, outside
        self._sent += len(sent)
        for rid in sent:
            self._seen.pop(rid, None)
        self.micros = next_floor(self.micros, entrants, self.target)
