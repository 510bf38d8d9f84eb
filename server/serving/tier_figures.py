"""What each tier has recently bought (`GET /v1/market/tiers`): the mean priority of its
requests in their batches, so that a client can weigh a tier's price against it.

A request's priority is (n-1-k)/(n-1) at position k of a batch of n (1 alone in its batch):
the share of its batch it went ahead of. The figures are this replica's last `window`
requests of each tier; before a tier has any, its figure is what an even split of the batch
by tier would give it (the dearest tier the top share, and so on), so a client can choose
before any traffic. Integers in parts per million, so that a client's comparison of
value x priority with a price stays in integers.
"""

from __future__ import annotations

from collections import deque
from fractions import Fraction

from inference_auctions.server.serving.tiers import TierMenu

__all__ = ["PPM", "TierFigures"]

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
