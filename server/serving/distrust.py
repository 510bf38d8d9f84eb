"""Users whose batches wait for their commits before the engine sees them, for a while.

A batch is sent to the engine ahead of its settlement's commit only when the ledger writer's
estimate says its users can afford their queued bids (`server.serving.dispatch_ahead`). That
estimate cannot see another replica's spending, and a request sent ahead that the commit then
refuses voids its whole batch, other users' requests included. So a user one of whose holds was
refused (the budget spent meanwhile on another replica, a rid settled or held elsewhere) or
could not be claimed is distrusted for `seconds`: their batches wait for their commits.
"""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["Distrust"]

_DISTRUST_SECONDS = 60.0
# Distrusted users remembered before the expired ones are swept out. The next sweep waits
# for twice as many as the last one kept, so a flood of refusals naming many users costs
# amortized constant time per refusal.
_SWEEP = 10_000


class Distrust:
    """Who is distrusted until when (see the module docstring)."""

    def __init__(
        self,
        seconds: float = _DISTRUST_SECONDS,
        sweep: int = _SWEEP,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._seconds = seconds
        self._sweep = sweep
        self._clock = clock
        self._sweep_at = sweep
        self._until: dict[str, float] = {}  # user -> when (`clock`) their distrust ends

    @property
    def sweep_at(self) -> int:
        """How many users remembered make the next `add` sweep the expired ones out."""
        return self._sweep_at

    def add(self, user: str) -> None:
        """The user's next batches wait for their commits, for the next `seconds`."""
        now = self._clock()
        if len(self._until) >= self._sweep_at:
            self._until = {u: t for u, t in self._until.items() if t > now}
            self._sweep_at = max(self._sweep, 2 * len(self._until))
        self._until[user] = now + self._seconds

    def trusted(self, user: str, now: float) -> bool:
        """Whether the user's batch may go to the engine ahead of its commit at `now` (a
        reading of the same clock)."""
        return self._until.get(user, 0.0) <= now

    def __len__(self) -> int:
        """Users remembered, expired or not (until the next sweep)."""
        return len(self._until)
