"""What a request's pricing fields say under the server's pricing mode: its bid, or its tier.

Every mode reads both `bid` and `service_tier` (OpenAI's field) and returns the amount the
request is admitted at, which its hold covers and the ledger records as its `bid_micros`:

* `auction`: the bid. A `service_tier` other than `auto` is refused by name: priority here is
  bought with a bid.
* `tiers`: the price of the tier named (none, or `auto`: the default tier). An unknown tier is
  refused by name, listing the tiers; so is a bid above 0, since a tier's price is fixed and a
  bid would buy nothing.
* `fcfs`: 0. A bid is ignored (the response's `auction.pricing` says `fcfs` and its
  `bid_micros` is 0); a `service_tier` other than `auto` is refused by name.
"""

from __future__ import annotations

from typing import Any

from inference_auctions.server.api.deps import AppState
from inference_auctions.server.api.generation import parse_bid
from inference_auctions.server.errors import InvalidRequest
from inference_auctions.server.serving.tiers import AUTO, TierMenu

__all__ = ["admission_amount"]


def admission_amount(state: AppState, bid_value: Any, tier_value: Any) -> int:
    """The micro-credits the request is admitted at (see the module docstring)."""
    settings = state.settings
    bid = parse_bid(bid_value, state)  # checked in every mode: a malformed bid is an error
    if settings.pricing == "tiers":
        menu = state.service.tier_menu
        assert menu is not None  # the service builds it in this mode
        if bid:
            raise InvalidRequest(
                "bid: this server sells fixed-price tiers, not bids; choose one with "
                f"service_tier ({_choices(menu)}) and leave bid out (or 0)",
                param="bid",
            )
        return _tier_price(menu, tier_value)
    if tier_value is not None and tier_value != AUTO:
        what = (
            "an auction: priority is bought with a bid"
            if settings.pricing == "auction"
            else ("first come, first served: every request has the same priority")
        )
        raise InvalidRequest(
            f"service_tier: this server runs {what}; leave service_tier out (or 'auto')",
            param="service_tier",
        )
    return 0 if settings.pricing == "fcfs" else bid


def _tier_price(menu: TierMenu, value: Any) -> int:
    if value is not None and not isinstance(value, str):
        raise InvalidRequest(
            f"service_tier: expected a tier's name, got {type(value).__name__}",
            param="service_tier",
        )
    tier = menu.named(value)
    if tier is None:
        raise InvalidRequest(
            f"service_tier: {value!r} is not a tier of this server; choose one of "
            f"{_choices(menu)}, or 'auto' for the default ({menu.default.name})",
            param="service_tier",
        )
    return tier.price_micros


def _choices(menu: TierMenu) -> str:
    return ", ".join(f"{tier.name!r}" for tier in menu.tiers)
