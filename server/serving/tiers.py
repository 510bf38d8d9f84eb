"""The fixed-price tiers a `--pricing tiers` server sells, and how a request picks one.

A deployment lists its tiers as `name=price` pairs, price in credits per request (`flex=0,
default=0.0005,priority=0.005`). A dearer tier is served first: prices must differ, so that
the order of the tiers is the order of their prices, and the ledger, which records each
request's price as its `bid_micros`, can tell every request's tier from its price alone.
A request names its tier in `service_tier` (OpenAI's field); none, or `auto`, is the default
tier. The engine priority of a tier is its rank from the top times `ENGINE_PRIORITY_GAP`:
SGLang (low values first) serves a dearer tier's waiting requests first, lets them preempt a
cheaper tier's running ones (more urgent by more than its preemption threshold of 10), and
keeps first come, first served within a tier (equal values: arrival order, no preemption).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from inference_auctions.billing import InvalidAmount, parse_credits

__all__ = [
    "AUTO",
    "ENGINE_PRIORITY_GAP",
    "Tier",
    "TierMenu",
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
