"""Choosing a fixed-price tier from a value, on a server run with `--pricing tiers`.

A tier buys an expected priority: the share of its competitors a request goes ahead of (of the
requests whose waits overlapped its own, those sent to the engine after it; 1 for a request
nobody waited beside), which the server publishes for each tier as the mean over its recent
requests (`GET /v1/market/tiers`, `expected_priority_ppm`, parts per million), beside their
median wait (`recent_wait_ms`). Going first being worth `value` to the user, a tier's expected
gain is `value x expected priority - price`; `choose_tier` takes the tier of the largest gain,
the cheaper on a tie, among those the budget still covers. Integers throughout: gains are
compared in micro-credits times a million.
"""

from __future__ import annotations

from ._models import Tier, TierMenu
from ._money import to_micros
from ._types import Money

__all__ = ["choose_tier", "expected_gain_micros"]

_PPM = 1_000_000


def expected_gain_micros(value: Money, tier: Tier) -> int:
    """`value x expected priority - price`, in micro-credits (rounded down)."""
    value_micros = to_micros(value, name="value")
    return (value_micros * tier.expected_priority_ppm - tier.price_micros * _PPM) // _PPM


def choose_tier(value: Money, menu: TierMenu, *, available_micros: int | None = None) -> Tier:
    """The tier of the largest expected gain for a request worth `value` credits (ties: the
    cheaper), among the tiers priced within `available_micros` when given (the cheapest tier
    if none is)."""
    value_micros = to_micros(value, name="value")
    if not menu.tiers:
        raise ValueError("the server published no tiers")
    cheapest = min(menu.tiers, key=lambda tier: tier.price_micros)
    affordable = [
        tier
        for tier in menu.tiers
        if available_micros is None or tier.price_micros <= available_micros
    ] or [cheapest]
    return max(
        affordable,
        key=lambda tier: (
            value_micros * tier.expected_priority_ppm - tier.price_micros * _PPM,
            -tier.price_micros,
        ),
    )
