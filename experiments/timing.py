"""The manipulation study of time: what a user gains by timing its requests under the rolling
auction, on the live plan's workloads, in the slot model of `experiments.timing_model`.

For each target request (given an account of its own), the market is replayed from the slot
the target arrives, once truthfully and once per deviation:

* its bid times 0.01 to 10 (`MULTIPLIERS`);
* sent later by 2, 10 or 40 slots (its need, hence its delay, starts when it arrived);
* sent low, cancelled after a wait if not yet sent, and sent again higher (`RESUBMITS`);
* overbidding just before a burst of low bids (the truthful bid before the same burst is its
  baseline);
* persistent micro-bid decoys (1 micro-credit each, from a second account) under the prefix of
  the rival the pool serves first, each withdrawn whenever a clearing would send it, all
  withdrawn once the target is sent.

Utility (SPEC section 5's reading of a bid): a request of value v sent after a delay of d
positions is worth `v * max(0, K-1-d) / (K-1)`, minus what its user pays for it; a deviation
counts when it raises that, exactly (rationals). Rules (`timing_model`): `dispatch`, `floor`,
and `horizon`, whose charge is the target's externality on every other request waiting at or
arriving within `horizon` slots of its arrival, measured on their bids by replaying the market
without the target (a pivot settled after the fact), capped at the target's bid.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from fractions import Fraction

import numpy as np

from inference_auctions.experiments.live_plan import make_plan
from inference_auctions.experiments.timing_model import (
    MarketConfig,
    MarketState,
    SlotMarket,
    SlotRequest,
    by_slot,
    fresh_tokens,
)
from inference_auctions.server.auction.batch import TokenArray
from inference_auctions.server.engine.builtin_tokenizer import encode

__all__ = [
    "DEVIATIONS",
    "Deviation",
    "Market",
    "TargetResult",
    "TimingSetup",
    "build_market",
    "burst_requests",
    "decoy_requests",
    "study_target",
    "summarize",
    "target_utility",
]

MULTIPLIERS = (0.01, 0.1, 0.3, 0.5, 0.8, 1.25, 2.0, 4.0, 10.0)
LATENESS = (2, 10, 40)
RESUBMITS = ((0.25, 2, 1.0), (0.25, 2, 2.0), (0.5, 4, 2.0))  # first bid, wait, second bid
BURST_OVERBIDS = (2.0, 5.0)
DECOYS = (4, 16)
TARGET_USER = "target"
DECOY_USER = "target-decoys"
_FRESH = 1 << 40  # token ids from here on appear in no prompt


@dataclass(frozen=True, slots=True)
class Deviation:
    """One way to send the target: bids (multiples of its value) sent at offsets from its
    arrival, each later one cancelling the earlier if still waiting; a burst of low bids the
    slot after; decoys."""

    name: str
    family: str
    sends: tuple[tuple[int, float], ...] = ((0, 1.0),)
    burst: bool = False
    decoys: int = 0


TRUTHFUL = Deviation("truthful", "truthful")
BURST_TRUTHFUL = Deviation("burst, truthful", "truthful", burst=True)
DEVIATIONS: tuple[Deviation, ...] = (
    *(Deviation(f"bid x{m:g}", "bid", ((0, m),)) for m in MULTIPLIERS),
    *(Deviation(f"late +{d}", "late", ((d, 1.0),)) for d in LATENESS),
    *(
        Deviation(f"x{a:g}, after {w} x{b:g}", "resubmit", ((0, a), (w, b)))
        for a, w, b in RESUBMITS
    ),
    *(Deviation(f"burst, x{m:g}", "burst", ((0, m),), burst=True) for m in BURST_OVERBIDS),
    *(Deviation(f"{n} decoys", "decoys", decoys=n) for n in DECOYS),
)
FAMILIES = ("bid", "late", "resubmit", "burst", "decoys")


@dataclass(frozen=True, slots=True)
class TimingSetup:
    """The study's size: loads, seeds, targets per seed, the engine and the rules' settings."""

    loads: tuple[float, ...] = (1.2, 1.5, 2.0)
    seeds: tuple[int, ...] = (1, 2, 3)
    targets: int = 100
    starts: int = 8  # the live plan's emulator runs 8 requests at once
    slots: int = 64  # K: the live plan's batch size
    warmup: int = 40  # slots before the first target (the floor settles)
    span: int = 40  # slots over which targets arrive
    floor_target: int = 8  # one slot of starts (docs/dev/2026-12-07-timing-rules.md)
    horizon: int = 8  # slots of later arrivals the settled charge counts

    def config(self) -> MarketConfig:
        return MarketConfig(self.starts, self.slots, self.floor_target)


@dataclass(slots=True)
class Market:
    """One seed and load: its requests by slot, each tenant's shared prefix, and the truthful
    run under each rule (its states before every slot, its welfare and revenue)."""

    setup: TimingSetup
    requests: list[SlotRequest]
    arrivals: dict[int, list[SlotRequest]]
    prefixes: dict[str, TokenArray]
    end: int
    states: dict[str, list[MarketState]] = field(default_factory=dict)
    welfare: dict[str, float] = field(default_factory=dict)  # share of all value
    revenue: dict[str, float] = field(default_factory=dict)  # share of all value


def build_market(setup: TimingSetup, seed: int, load: float) -> Market:
    """The live plan at `load`, its arrivals in slots, and the truthful runs of `dispatch`
    and `floor` (`horizon` orders as `dispatch`)."""
    config = setup.config()
    first_pass = make_plan(
        seed, 1.0, load=load, max_running_requests=setup.starts, cache_tokens=23_000
    )
    slots_per_second = first_pass.capacity_rps / setup.starts
    last = setup.warmup + setup.span + config.window + 4
    plan = make_plan(
        seed,
        last / slots_per_second,
        load=load,
        max_running_requests=setup.starts,
        cache_tokens=23_000,
    )
    requests = [
        SlotRequest(
            rid=f"p{planned.index}",
            user=planned.tenant,
            tokens=np.asarray(encode(planned.prompt), dtype=np.int64),
            bid=planned.value_micros,
            value=planned.value_micros,
            needed=math.ceil(planned.at * slots_per_second),
            arrival=math.ceil(planned.at * slots_per_second),
        )
        for planned in plan.requests
    ]
    market = Market(setup, requests, by_slot(requests), _prefixes(requests), last)
    total_value = sum(r.value for r in requests)
    stop = last + config.window + 2
    for rule in ("dispatch", "floor"):
        run = SlotMarket(config, rule, market.arrivals)
        states = []
        for slot in range(stop):
            states.append(run.state.copy())
            run.step(slot)
        market.states[rule] = states
        market.welfare[rule] = _welfare(run, requests, setup) / total_value
        market.revenue[rule] = run.charged / total_value
    market.states["horizon"] = market.states["dispatch"]
    market.welfare["horizon"] = market.welfare["dispatch"]
    return market


def _prefixes(requests: Sequence[SlotRequest]) -> dict[str, TokenArray]:
    """Each tenant's prompt prefix: the tokens its first two requests share."""
    firsts: dict[str, list[TokenArray]] = {}
    for request in requests:
        firsts.setdefault(request.user, [])
        if len(firsts[request.user]) < 2:
            firsts[request.user].append(request.tokens)
    prefixes = {}
    for user, pair in firsts.items():
        if len(pair) < 2:
            continue
        size = min(len(pair[0]), len(pair[1]))
        differ = np.flatnonzero(pair[0][:size] != pair[1][:size])
        prefixes[user] = pair[0][: int(differ[0]) if differ.size else size]
    return prefixes


def _welfare(run: SlotMarket, requests: Sequence[SlotRequest], setup: TimingSetup) -> float:
    """Sum of the requests' values for the delays they got."""
    total = Fraction(0)
    for request in requests:
        sent = run.dispatched.get(request.rid)
        if sent is not None:
            total += target_utility(request.value, sent.delay(request, setup.starts), 0, setup)
    return float(total)


def target_utility(value: int, delay: int | None, charge: int, setup: TimingSetup) -> Fraction:
    """A request's value for its delay in positions (None: never sent), minus its charge."""
    if delay is None:
        return Fraction(0)
    worth = Fraction(value * max(0, setup.slots - 1 - delay), setup.slots - 1)
    return worth - charge


# ---- One target ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Replay:
    """What one replay gave the target: its delay (None: never sent), its at-dispatch charge,
    the bid it was sent with, and the other requests' welfare on their bids (numerator over
    K-1) for the settled charge."""

    delay: int | None
    charge: int
    bid: int
    others: int


@dataclass(frozen=True, slots=True)
class TargetResult:
    """A target's truthful utility and its utility under each deviation, per rule."""

    rid: str
    value: int
    load: float
    seed: int
    truthful: dict[str, Fraction]
    utilities: dict[str, dict[str, Fraction]]  # rule -> deviation name -> utility
    charges: dict[str, int]  # rule -> truthful charge

    def gain(self, rule: str, family: str | None = None) -> Fraction:
        """The best deviation's gain over the baseline (0 when none gains), as a share of value."""
        best = Fraction(0)
        for deviation in DEVIATIONS:
            if family is not None and deviation.family != family:
                continue
            base_name = BURST_TRUTHFUL.name if deviation.burst else TRUTHFUL.name
            base = self.utilities[rule][base_name]
            best = max(best, self.utilities[rule][deviation.name] - base)
        return best / self.value


def study_target(market: Market, target: SlotRequest, seed: int, load: float) -> TargetResult:
    """Every deviation of one target, under the three rules."""
    setup = market.setup
    utilities: dict[str, dict[str, Fraction]] = {rule: {} for rule in ("dispatch", "floor")}
    utilities["horizon"] = {}
    charges: dict[str, int] = {}
    without = {burst: _replay(market, target, None, "dispatch", burst) for burst in (False, True)}
    for deviation in (TRUTHFUL, BURST_TRUTHFUL, *DEVIATIONS):
        for rule in ("dispatch", "floor"):
            played = _replay(market, target, deviation, rule, deviation.burst)
            utilities[rule][deviation.name] = target_utility(
                target.value, played.delay, played.charge, setup
            )
            if deviation is TRUTHFUL:
                charges[rule] = played.charge
            if rule == "dispatch":
                settled = _settled_charge(played, without[deviation.burst], setup)
                utilities["horizon"][deviation.name] = target_utility(
                    target.value, played.delay, settled, setup
                )
                if deviation is TRUTHFUL:
                    charges["horizon"] = settled
    truthful = {rule: utilities[rule][TRUTHFUL.name] for rule in utilities}
    return TargetResult(target.rid, target.value, load, seed, truthful, utilities, charges)


def _settled_charge(played: Replay, without: Replay, setup: TimingSetup) -> int:
    """The pivot settled after the fact: what the target cost the others, on their bids."""
    if played.delay is None:
        return 0
    # Capped at what its own bid says the service it got was worth: a truthful user never
    # pays more than its value for the delay it got, however long the busy period.
    worth = played.bid * max(0, setup.slots - 1 - played.delay) // (setup.slots - 1)
    return min(max(0, (without.others - played.others) // (setup.slots - 1)), worth)


def _replay(
    market: Market,
    target: SlotRequest,
    deviation: Deviation | None,
    rule: str,
    burst: bool,
) -> Replay:
    """The market from the target's arrival with the target sent as `deviation` says (None:
    not at all), under `rule`, run until the target is settled and, for the others' welfare,
    until every request of the horizon is served or gone."""
    setup = market.setup
    config = setup.config()
    start = target.arrival
    sends = deviation.sends if deviation is not None else ()
    if sends and setup.starts * sends[0][0] >= setup.slots - 1:
        # Sent when its value is already gone: withdrawn at once, never charged.
        return Replay(None, 0, 0, 0)
    arrivals = dict(market.arrivals)
    arrivals[start] = [r for r in arrivals.get(start, []) if r.rid != target.rid]
    extra = burst_requests(target, setup) if burst else []
    if extra:
        arrivals[start + 1] = [*arrivals.get(start + 1, []), *extra]
    state = market.states[rule][start]
    run = SlotMarket(
        config, rule, arrivals, state, priced={TARGET_USER} if deviation is not None else set()
    )
    counted = _counted(run, arrivals, start, setup)
    live: str | None = None
    decoys = decoy_requests(market, target, deviation, state) if deviation is not None else []
    run.avoid.update(decoy.rid for decoy in decoys)
    for decoy in decoys:
        run.submit(decoy)
    stop = start + setup.horizon + config.window + 2
    slot = start
    cap = start + max((offset for offset, _ in sends), default=0) + config.window + 2
    while slot < max(stop, cap):
        live = _send_target(run, target, sends, slot, live)
        run.step(slot)
        settled = live is not None and not run.is_waiting(live)
        if settled and decoys:
            for decoy in decoys:
                run.withdraw(decoy.rid)
            decoys = []
        if rule == "floor" and settled and slot >= start + sends[-1][0]:
            break  # the floor has no settled charge: nothing after the target matters
        slot += 1
    sent = run.dispatched.get(live) if live is not None else None
    bid = run.requests[live].bid if live is not None else 0
    delay = sent.delay(target, setup.starts) if sent is not None else None
    others = sum(
        run.requests[rid].bid
        * max(0, setup.slots - 1 - run.dispatched[rid].delay(run.requests[rid], setup.starts))
        for rid in counted
        if rid in run.dispatched
    )
    return Replay(delay, sent.charge if sent is not None else 0, bid, others)


def _send_target(
    run: SlotMarket,
    target: SlotRequest,
    sends: tuple[tuple[int, float], ...],
    slot: int,
    live: str | None,
) -> str | None:
    """Send the target's request due at `slot`, cancelling the earlier one if it still waits
    (one already sent or withdrawn stays so, and nothing more is sent); the live one's rid."""
    for number, (offset, multiple) in enumerate(sends):
        if slot != target.arrival + offset:
            continue
        if live is not None:
            if not run.is_waiting(live):
                continue
            run.withdraw(live)
        bid = max(1, round(target.value * multiple))
        live = f"{TARGET_USER}-{number}"
        run.submit(
            SlotRequest(live, TARGET_USER, target.tokens, bid, target.value, target.arrival, slot)
        )
    return live


def _counted(
    run: SlotMarket, arrivals: dict[int, list[SlotRequest]], start: int, setup: TimingSetup
) -> set[str]:
    """The requests whose welfare the settled charge counts: waiting at the target's arrival
    or arriving within the horizon."""
    counted = set(run.state.waiting)
    for slot in range(start, start + setup.horizon + 1):
        counted.update(r.rid for r in arrivals.get(slot, []))
    return counted


def burst_requests(target: SlotRequest, setup: TimingSetup) -> list[SlotRequest]:
    """Three slots' worth of low bids (the batch class's scale) the slot after the target."""
    return [
        SlotRequest(
            f"burst-{number}",
            f"burst-{number % 3}",
            fresh_tokens(_FRESH + 64 * number, 48),
            100,
            100,
            target.arrival + 1,
            target.arrival + 1,
        )
        for number in range(3 * setup.starts)
    ]


def decoy_requests(
    market: Market, target: SlotRequest, deviation: Deviation, state: MarketState
) -> list[SlotRequest]:
    """Micro-bids under the prefix of the rival tenant whose request the pool serves first."""
    if deviation.decoys == 0:
        return []
    rivals = [
        request
        for request, _ in sorted(state.waiting.values(), key=lambda pair: -pair[0].bid)
        if request.user != target.user and request.user in market.prefixes
    ]
    if not rivals:
        return []
    prefix = market.prefixes[rivals[0].user]
    return [
        SlotRequest(
            f"decoy-{number}",
            DECOY_USER,
            np.concatenate([prefix, fresh_tokens(_FRESH * 2 + 16 * number, 4)]),
            1,
            0,
            target.arrival,
            target.arrival,
        )
        for number in range(deviation.decoys)
    ]


# ---- The study -------------------------------------------------------------------------------


def choose_targets(market: Market, count: int, seed: int) -> list[SlotRequest]:
    """`count` requests arriving after the warm-up, drawn evenly by the seed."""
    setup = market.setup
    pool = [r for r in market.requests if setup.warmup <= r.arrival < setup.warmup + setup.span]
    rng = np.random.default_rng(seed)
    picked = rng.choice(len(pool), size=min(count, len(pool)), replace=False)
    return [pool[int(index)] for index in sorted(picked)]


def study_market(setup: TimingSetup, seed: int, load: float) -> tuple[Market, list[TargetResult]]:
    """One seed and load: its market and every target's results."""
    market = build_market(setup, seed, load)
    targets = choose_targets(market, setup.targets, seed)
    return market, [study_target(market, target, seed, load) for target in targets]


@dataclass(frozen=True, slots=True)
class RuleSummary:
    """One rule at one load, over its seeds' targets."""

    rule: str
    load: float
    targets: int
    profitable: float  # share of targets with a profitable deviation
    material: float  # share of targets with a deviation that gains more than 1% of value
    worst_seed: float  # the largest share of targets with a profitable deviation in one seed
    by_family: dict[str, float]
    median_gain: float  # percent of value, over all targets (0 where none gains)
    p90_gain: float
    welfare: float  # percent of all value
    revenue: float  # percent of all value (the settled charge: the targets' charges)
    target_revenue: float  # the targets' truthful charges, percent of their values


def summarize(
    rule: str, load: float, results: Sequence[TargetResult], markets: Sequence[Market]
) -> RuleSummary:
    """The table row of one rule and load."""
    gains = [float(result.gain(rule)) * 100 for result in results]
    by_family = {
        family: sum(1 for r in results if r.gain(rule, family) > 0) / len(results)
        for family in FAMILIES
    }
    target_revenue = 100 * sum(r.charges[rule] for r in results) / sum(r.value for r in results)
    revenue = (
        target_revenue
        if rule == "horizon"
        else 100 * statistics.fmean(m.revenue[rule] for m in markets)
    )
    return RuleSummary(
        rule=rule,
        load=load,
        targets=len(results),
        profitable=sum(1 for g in gains if g > 0) / len(results),
        material=sum(1 for g in gains if g > 1) / len(results),
        worst_seed=max(
            sum(1 for r in results if r.seed == seed and r.gain(rule) > 0)
            / sum(1 for r in results if r.seed == seed)
            for seed in {r.seed for r in results}
        ),
        by_family=by_family,
        median_gain=statistics.median(gains),
        p90_gain=float(np.percentile(gains, 90)),
        welfare=100 * statistics.fmean(m.welfare[rule] for m in markets),
        revenue=revenue,
        target_revenue=target_revenue,
    )
