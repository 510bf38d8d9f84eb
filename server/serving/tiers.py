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

What each tier has recently bought (`GET /v1/market/tiers`): the mean priority of its
requests in their batches, so that a client can weigh a tier's price against it.

A request's priority is (n-1-k)/(n-1) at position k of a batch of n (1 alone in its batch):
the share of its batch it went ahead of. The figures are this replica's last `window`
requests of each tier; before a tier has any, its figure is what an even split of the batch
by tier would give it (the dearest tier the top share, and so on), so a client can choose
before any traffic. Integers in parts per million, so that a client's comparison of
value x priority with a price stays in integers.
"""

from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass
from fractions import Fraction

from inference_auctions.billing import InvalidAmount, parse_credits

__all__ = ["AUTO", "ENGINE_PRIORITY_GAP", "PPM", "Tier", "TierFigures", "TierMenu", "parse_tiers"]

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


PPM = 1_000_000
_WINDOW = 1_000


class TierFigures:
    """The recent priorities of each tier's requests (see the module docstring)."""

    def __init__(self, menu: TierMenu | None, window: int = _WINDOW) -> None:
        self._menu = menu
        self._recent: dict[str, deque[int]] = {}
        self._window = window

    def observe(self, tier: str, priority: Fraction) -> None:
        """A request of `tier` was cleared at `priority`."""
        recent = self._recent.setdefault(tier, deque(maxlen=self._window))
        recent.append(int(priority * PPM))

    def expected_priority_ppm(self, tier: str) -> int:
        """The mean recent priority of the tier's requests, in parts per million."""
        recent = self._recent.get(tier)
        if recent:
            return sum(recent) // len(recent)
        return self._prior_ppm(tier)

    def samples(self, tier: str) -> int:
        """How many recent requests the tier's figure is drawn from (0: the prior)."""
        return len(self._recent.get(tier, ()))

    def _prior_ppm(self, tier: str) -> int:
        if self._menu is None:
            return PPM
        count = len(self._menu.tiers)
        rank = next(t.rank for t in self._menu.tiers if t.name == tier)
        # The middle of the tier's share when the batch splits evenly, dearest on top.
        return (2 * (count - rank) - 1) * PPM // (2 * count)
