"""The fixed-price tiers a tiers server sells, how a request picks one, and what each bought.

A deployment lists its tiers as `name=price` pairs, price in credits per request (`flex=0,
default=0.0005,priority=0.005`). A dearer tier is served first: prices must differ, so that
the order of the tiers is the order of their prices, and the ledger, which records each
request's price as its `bid_micros`, can tell every request's tier from its price alone.
A request names its tier in `service_tier` (OpenAI's field); none, or `auto`, is the default
tier. The engine priority of a tier is its rank from the top times `ENGINE_PRIORITY_GAP`:
SGLang (low values first) serves a dearer tier's waiting requests first, lets them preempt a
cheaper tier's running ones (more urgent by more than its preemption threshold of 10), and
keeps first come, first served within a tier (equal values: arrival order, no preemption).

What each tier has recently bought (`GET /v1/market/tiers`), so that a client can weigh a
tier's price against it:

* `expected_priority_ppm`: the mean, over the tier's recent requests, of the share of their
  competitors each went ahead of: of the requests whose waits overlapped its own (a wait runs
  from joining the waiting pool to being sent to the engine), those sent after it
  (`server.auction.wait_overlap`). A request nobody waited beside counts 1: it lost nothing.
  Unlike its place within the head it was sent in, this sees the whole pool it waited in,
  however few requests each dispatch takes. Before a tier has any request, its figure is what
  an even split of the pool by tier would give it (the dearest tier the top share, and so
  on), so a client can choose before any traffic.
* `recent_wait_ms`: the median wait of its recent requests, from arrival to dispatch.

The figures are this replica's last `window` requests of each tier; the shares are integers in
parts per million, so that a client's comparison of value x priority with a price stays in
integers.
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import median_low
from typing import NamedTuple

from inference_auctions.billing import InvalidAmount, parse_credits
from inference_auctions.server.auction.wait_overlap import PPM, DispatchHistory

__all__ = [
    "AUTO",
    "ENGINE_PRIORITY_GAP",
    "PPM",
    "Tier",
    "TierFigures",
    "TierMenu",
    "Waited",
    "parse_tiers",
]

# Above SGLang's default `--priority-scheduling-preemption-threshold` (10): one tier apart is
# urgent enough to preempt, the same tier never is.
ENGINE_PRIORITY_GAP = 100
# OpenAI's `service_tier` value for "let the server choose": the default tier.
AUTO = "auto"
_NAME = re.compile(r"[a-z][a-z0-9_-]{0,31}")


@dataclass(frozen=True, slots=True)
class Tier:
    """One tier: its name, its price per request, and its rank (0 is served first)."""

    name: str
    price_micros: int
    rank: int

    @property
    def engine_priority(self) -> int:
        """The SGLang priority of its requests (lower goes first)."""
        return self.rank * ENGINE_PRIORITY_GAP


@dataclass(frozen=True, slots=True)
class TierMenu:
    """The tiers, dearest first, and the one a request without `service_tier` gets."""

    tiers: tuple[Tier, ...]
    default: Tier

    def named(self, name: str | None) -> Tier | None:
        """The tier called `name` (None or `auto`: the default); None if there is none."""
        if name is None or name == AUTO:
            return self.default
        return next((tier for tier in self.tiers if tier.name == name), None)

    def by_price(self, price_micros: int) -> Tier | None:
        """The tier sold at `price_micros` (prices are distinct)."""
        return next((tier for tier in self.tiers if tier.price_micros == price_micros), None)

    @property
    def names(self) -> list[str]:
        """Every tier's name, dearest first."""
        return [tier.name for tier in self.tiers]


def parse_tiers(text: str, default: str | None = None, *, maximum: int) -> TierMenu:
    """The menu of `name=price,...` (prices in credits, at most `maximum` micro-credits); the
    default tier is `default`, else the cheapest. Raises ValueError naming what is wrong."""
    pairs: list[tuple[str, int]] = []
    for item in text.split(","):
        name, equals, price = item.strip().partition("=")
        name = name.strip()
        if not equals or not _NAME.fullmatch(name):
            raise ValueError(
                f"tiers: {item.strip()!r} is not name=price (a lowercase name of at most 32 "
                "letters, digits, '-' or '_', then a price in credits, e.g. priority=0.005)"
            )
        if name == AUTO:
            raise ValueError("tiers: 'auto' is reserved: it means the default tier")
        try:
            micros = parse_credits(price.strip(), f"tiers: the price of {name!r}", maximum)
        except InvalidAmount as error:
            raise ValueError(str(error)) from None
        pairs.append((name, micros))
    names = [name for name, _ in pairs]
    if len(set(names)) != len(names):
        raise ValueError(f"tiers: a name appears twice in {text!r}")
    prices = [price for _, price in pairs]
    if len(set(prices)) != len(prices):
        raise ValueError(
            f"tiers: two tiers share a price in {text!r}; a dearer tier is served first, so "
            "each needs a price of its own"
        )
    ordered = sorted(pairs, key=lambda pair: -pair[1])
    tiers = tuple(Tier(name, price, rank) for rank, (name, price) in enumerate(ordered))
    if default is None:
        return TierMenu(tiers, tiers[-1])
    chosen = next((tier for tier in tiers if tier.name == default), None)
    if chosen is None:
        raise ValueError(f"default_tier: {default!r} is not one of the tiers {names}")
    return TierMenu(tiers, chosen)


_WINDOW = 1_000


class Waited(NamedTuple):
    """One request of a head sent to the engine: its tier (None: none), and when it arrived
    and when it joined the waiting pool (monotonic seconds)."""

    tier: str | None
    arrived: float
    joined: float


class _Recent:
    """One tier's last `window` requests: their shares, with their sum kept as they move (the
    mean in O(1)), and their waits in milliseconds."""

    def __init__(self, window: int) -> None:
        self.shares: deque[int] = deque(maxlen=window)
        self._share_sum = 0
        self._waits: deque[int] = deque(maxlen=window)
        self._counted = 0  # requests ever counted, so that a median is sorted once per change
        self._median: tuple[int, int] = (-1, 0)  # (`_counted` then, the median then)

    def add(self, share_ppm: int, wait_ms: int) -> None:
        if len(self.shares) == self.shares.maxlen:
            self._share_sum -= self.shares[0]
        self.shares.append(share_ppm)
        self._share_sum += share_ppm
        self._waits.append(wait_ms)
        self._counted += 1

    def mean_share_ppm(self) -> int:
        return self._share_sum // len(self.shares)

    def median_wait_ms(self) -> int:
        # Sorted when a menu is read, not as each request is counted; at most once per change.
        if self._median[0] != self._counted:
            self._median = (self._counted, median_low(self._waits))
        return self._median[1]


class TierFigures:
    """What each tier's recent requests got (see the module docstring)."""

    def __init__(self, menu: TierMenu | None, window: int = _WINDOW) -> None:
        self._menu = menu
        self._window = window
        self._history = DispatchHistory()
        self._recent: dict[str, _Recent] = {}

    def sent(self, head: Sequence[Waited], at: float, still_waiting: int) -> None:
        """A head went to the engine at `at`, in its order, `still_waiting` requests staying
        in the pool."""
        joined = [request.joined for request in head]
        overlaps = self._history.sent(joined, at, still_waiting)
        for request, overlap in zip(head, overlaps, strict=True):
            if request.tier is None:
                continue
            share = overlap.share_ppm()
            recent = self._recent.get(request.tier)
            if recent is None:
                recent = self._recent[request.tier] = _Recent(self._window)
            # Nobody waited beside it: it lost nothing, as the first of any queue.
            recent.add(
                PPM if share is None else share, max(0, round((at - request.arrived) * 1000))
            )

    def expected_priority_ppm(self, tier: str) -> int:
        """The mean share of their competitors the tier's recent requests went ahead of, in
        parts per million."""
        recent = self._recent.get(tier)
        return self._prior_ppm(tier) if recent is None else recent.mean_share_ppm()

    def recent_wait_ms(self, tier: str) -> int | None:
        """The median wait of the tier's recent requests, arrival to dispatch, in
        milliseconds (None before it has any)."""
        recent = self._recent.get(tier)
        return None if recent is None else recent.median_wait_ms()

    def samples(self, tier: str) -> int:
        """How many recent requests the tier's figures are drawn from (0: the prior)."""
        recent = self._recent.get(tier)
        return 0 if recent is None else len(recent.shares)

    def _prior_ppm(self, tier: str) -> int:
        if self._menu is None:
            return PPM
        count = len(self._menu.tiers)
        rank = next(t.rank for t in self._menu.tiers if t.name == tier)
        # The middle of the tier's share when the queue splits evenly, dearest on top.
        return (2 * (count - rank) - 1) * PPM // (2 * count)
