"""A second, slow copy of the timing study's utility (`experiments.timing`), written apart from
it: every run starts from slot 0 (no saved states), every clearing orders the pool from scratch
(`rolling.order_pool`, not the kept `PoolTree`) and prices with `rolling.rolling_charges`.

Conventions shared with the study (they are the model, not its code): in a slot, the target's
own sends (decoys, then its request) join before the plan's arrivals of that slot; a request
whose delay reached K-1 positions is withdrawn before the clearing; the floor moves after it.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from inference_auctions.experiments.timing import (
    DECOY_USER,
    TARGET_USER,
    Deviation,
    Market,
    burst_requests,
    decoy_requests,
)
from inference_auctions.experiments.timing_model import SlotRequest
from inference_auctions.server.auction.batch import AuctionRequest
from inference_auctions.server.auction.rolling import PoolOrder, order_pool, rolling_charges


@dataclass
class _World:
    """Everything one slow run found: when each request went, and the target's charge."""

    sent: dict[str, tuple[int, int]]  # rid -> (slot, rank)
    charge: int
    bids: dict[str, int]


def _simulate(
    market: Market,
    rule: str,
    sends: list[tuple[int, SlotRequest]],
    extra: list[SlotRequest],
    decoys: list[SlotRequest],
    without: str,
    slots: int,
) -> _World:
    setup = market.setup
    starts, k = setup.starts, setup.slots
    floor = 0  # the server's start
    waiting: list[SlotRequest] = []
    sent: dict[str, tuple[int, int]] = {}
    target_rids = {request.rid for _, request in sends}
    charge = 0
    live: str | None = None
    plan = [r for r in market.requests if r.rid != without] + extra
    bids = {r.rid: r.bid for r in plan}
    for slot in range(slots):
        if decoys and decoys[0].arrival == slot:
            waiting.extend(decoys)
        for number, (at, request) in enumerate(sends):
            if at == slot and (number == 0 or any(w.rid == live for w in waiting)):
                waiting = [w for w in waiting if w.rid != live] + [request]
                bids[request.rid] = request.bid
                live = request.rid
        waiting.extend(r for r in plan if r.arrival == slot)
        decoy_rids = {d.rid for d in decoys}
        waiting = [w for w in waiting if w.rid in decoy_rids or starts * (slot - w.needed) < k - 1]
        least = max(1, floor) if rule == "floor" else 1
        waiting, entrants, pool, head = _clear(waiting, least, starts, decoy_rids)
        head_ix = pool.order[: min(starts, len(entrants))]
        mine = [i for i in head_ix if entrants[i].rid in target_rids]
        if mine:
            rolled = rolling_charges(pool, mine, k).get(TARGET_USER, 0)
            if rule == "floor":  # the floor on top, capped at the bid's worth for its delay
                worth = 0
                for i in mine:
                    delay = starts * (slot - entrants[i].needed) + head.index(entrants[i].rid)
                    worth += entrants[i].bid * max(0, k - 1 - delay) // (k - 1)
                charge = min(rolled + floor * len(mine), worth)
            else:
                charge = min(rolled, sum(entrants[i].bid for i in mine))
        for rank, rid in enumerate(head):
            sent[rid] = (slot, rank)
        waiting = [w for w in waiting if w.rid not in sent]
        if live is not None and live in sent:
            waiting = [w for w in waiting if w.user != DECOY_USER]
            decoys = []
        if rule == "floor":
            floor = _eip1559(floor, len(entrants), setup.floor_target)
    return _World(sent, charge, bids)


def _clear(
    waiting: list[SlotRequest], least: int, starts: int, decoys: set[str]
) -> tuple[list[SlotRequest], list[SlotRequest], PoolOrder, list[str]]:
    """One clearing from scratch: the bids of at least `least` ordered, the head of `starts`
    filled from the rest in arrival order, decoys that would go withdrawn and the clearing
    done again."""
    while True:
        entrants = [w for w in waiting if w.bid >= least]
        pool = order_pool(
            [AuctionRequest(w.rid, w.user, list(map(int, w.tokens)), w.bid) for w in entrants]
        )
        head = [entrants[i].rid for i in pool.order[:starts]]
        entered = {w.rid for w in entrants}
        head += [w.rid for w in waiting if w.rid not in entered][: starts - len(head)]
        if not decoys.intersection(head):
            return waiting, entrants, pool, head
        waiting = [w for w in waiting if not (w.rid in decoys and w.rid in head)]


def _eip1559(floor: int, depth: int, target: int) -> int:
    """Up or down by (depth - target)/target of an eighth, the gap clipped to one target, never
    below zero."""
    if depth == target:
        return floor
    gap = min(abs(depth - target), target)
    move = max(1, (floor * gap) // (target * 8))
    return floor + move if depth > target else max(0, floor - move)


def oracle_utility(
    market: Market, target: SlotRequest, deviation: Deviation, rule: str
) -> Fraction:
    """The target's utility under `deviation` and `rule`, the slow way."""
    setup = market.setup
    k, starts = setup.slots, setup.starts
    start = target.arrival
    slots = start + setup.horizon + 60
    sends = [
        (
            start + offset,
            SlotRequest(
                f"{TARGET_USER}-{number}",
                TARGET_USER,
                target.tokens,
                max(1, round(target.value * multiple)),
                target.value,
                start,
                start + offset,
            ),
        )
        for number, (offset, multiple) in enumerate(deviation.sends)
    ]
    extra = burst_requests(target, setup) if deviation.burst else []
    state = market.states["dispatch" if rule == "horizon" else rule][start]
    decoys = decoy_requests(market, target, deviation, state)
    world = _simulate(
        market, "floor" if rule == "floor" else "dispatch", sends, extra, decoys, target.rid, slots
    )
    got = [(rid, world.sent[rid]) for _, r in sends if (rid := r.rid) in world.sent]
    if not got:
        return Fraction(0)
    rid, (slot, rank) = got[0]
    delay = starts * (slot - start) + rank
    worth = Fraction(target.value * max(0, k - 1 - delay), k - 1)
    if rule != "horizon":
        return worth - world.charge
    alone = _simulate(market, "dispatch", [], extra, [], target.rid, slots)
    counted = [
        r.rid
        for r in [*market.requests, *extra]
        if r.rid != target.rid
        and r.needed <= start + setup.horizon
        and r.arrival <= start + setup.horizon
        and starts * (start - r.needed) < k - 1
        and not (r.rid in alone.sent and alone.sent[r.rid][0] < start)
    ]

    def others(run: _World) -> int:
        return sum(
            run.bids[r]
            * max(
                0, k - 1 - (starts * (run.sent[r][0] - _needed(market, extra, r)) + run.sent[r][1])
            )
            for r in counted
            if r in run.sent
        )

    bid = world.bids[rid]
    cap = bid * max(0, k - 1 - delay) // (k - 1)
    settled = min(max(0, (others(alone) - others(world)) // (k - 1)), cap)
    return worth - settled


def _needed(market: Market, extra: list[SlotRequest], rid: str) -> int:
    for request in [*market.requests, *extra]:
        if request.rid == rid:
            return request.needed
    raise KeyError(rid)


def sample_targets(market: Market, count: int) -> list[SlotRequest]:
    """Targets spread over the study's window."""
    rng = np.random.default_rng(7)
    window = [
        r
        for r in market.requests
        if market.setup.warmup <= r.arrival < market.setup.warmup + market.setup.span
    ]
    return [window[int(i)] for i in rng.choice(len(window), size=count, replace=False)]
