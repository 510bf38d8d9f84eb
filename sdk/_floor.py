"""The posted price floor as the client sees it: read at every ledger sync, warned about once
per value whose bid falls below it, and read into an `AuctionOutlook`.

A bid below the floor is not refused: it waits outside the auction, served only when no bid at
or above the floor waits, and pays nothing. Whether that is what the user wants is the user's
call (a batch job may be glad to wait for free), so the client warns rather than raise the bid
or hold the request back.
"""

from __future__ import annotations

import threading
import warnings
from collections import OrderedDict

from ._models import AuctionOutlook, MarketPool, PriceFloor
from ._money import format_credits

__all__ = ["BelowFloorWarning", "FloorWatch", "outlook"]

# Distinct values remembered as warned; past this many the oldest may warn again.
_MAX_WARNED = 1024


class BelowFloorWarning(UserWarning):
    """A request went out with a bid below the posted price floor: it waits outside the
    auction until no bid at or above the floor waits, and pays nothing."""


class FloorWatch:
    """The floor as last read, shared by a client and its `with_options` copies."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._floor: PriceFloor | None = None
        self._warned: OrderedDict[int, None] = OrderedDict()

    @property
    def floor(self) -> PriceFloor | None:
        """The floor as last read; None before the first read."""
        return self._floor

    @property
    def posted(self) -> bool:
        """Whether the floor last read is in force."""
        return self._floor is not None and self._floor.posted

    def update(self, floor: PriceFloor) -> None:
        """Take a floor read from the server."""
        self._floor = floor

    def update_level(self, micros: int | None) -> None:
        """Take the floor's level from a pool reading (None: no floor), keeping its target."""
        target = None if self._floor is None else self._floor.target
        if micros is None:
            self._floor = PriceFloor()
        else:
            self._floor = PriceFloor(mode="posted", micros=micros, target=target)

    def check(self, value_micros: int, bid_micros: int, *, stacklevel: int) -> None:
        """Warn, once per value, when that value's bid is below the floor last read."""
        floor = self._floor
        if floor is None or floor.micros is None or not floor.posted:
            return
        # A value of 0 asks for nothing but the room bidders leave: waiting outside is its point.
        if value_micros == 0 or bid_micros >= floor.micros:
            return
        with self._lock:
            if value_micros in self._warned:
                return
            self._warned[value_micros] = None
            while len(self._warned) > _MAX_WARNED:
                self._warned.popitem(last=False)
        warnings.warn(
            f"the bid of {format_credits(bid_micros)} credits for a value of "
            f"{format_credits(value_micros)} is below the price floor of "
            f"{format_credits(floor.micros)}: the request waits outside the auction, served "
            "only when no bid at or above the floor waits (it pays nothing then); raise the "
            "value to enter (warned once per value)",
            BelowFloorWarning,
            stacklevel=stacklevel + 1,
        )


def outlook(
    value_micros: int, bid_micros: int, floor_micros: int | None, pool: MarketPool | None
) -> AuctionOutlook:
    """What sending `bid_micros` now would meet: the floor (`floor_micros`, None: none) and,
    when the server publishes its pool, the entrants ahead and the wait they imply."""
    clears = bid_micros >= max(1, floor_micros or 0)
    if pool is None:
        return AuctionOutlook(
            value_micros=value_micros,
            bid_micros=bid_micros,
            price_floor_micros=floor_micros,
            clears_floor=clears,
        )
    wait = None
    if clears and pool.ahead is not None and pool.starts_per_second > 0:
        wait = pool.ahead / pool.starts_per_second
    return AuctionOutlook(
        value_micros=value_micros,
        bid_micros=bid_micros,
        price_floor_micros=floor_micros,
        clears_floor=clears,
        entrants=pool.entrants,
        outside=pool.outside,
        ahead=pool.ahead,
        starts_per_second=pool.starts_per_second,
        expected_wait_seconds=wait,
    )
