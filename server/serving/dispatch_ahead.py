"""Dispatch ahead of the commit: a batch sent to the engine while its settlement commits.

A lone request used to wait for two things in turn before the engine saw it: the commit that
places its hold and settles its batch, then the engine. When every user of a closed batch could
afford their queued bids as of the ledger's last commit (`LedgerWriter.affords_queued`), the server
clears the batch on the event loop and sends it to the engine at once, while the same commit
runs; the engine's work and the commit overlap.

What makes that safe for money is what waits for the commit (`settled`):

* the readers: a client sees nothing of a request before its clearance, and the clearance is
  given only once the commit settled the batch as it was sent;
* the `served` record and the last chunk, and a failure's refund: each request's follower
  waits for the commit before writing anything about it;
* the claim settles the batch as it was cleared here or nothing of it
  (`server.serving.clearing.BatchAheadVoid`): what is charged is always what the engine was given.

If the commit does not settle it, the batch is void: its generations are cancelled, what the
prefix deferral still held back is dropped, and once every follower has let go of its request
the requests are either cleared again, from the ledger, as if the batch had just closed (a
hold refused after all, or settled by another replica), or, if the commit itself failed,
failed as any batch that cannot be settled (503, nothing charged; `server.serving.clearing`). A
server that crashes meanwhile has charged nothing and answered nothing; the holds expire as
any do.

`Distrust`: users whose batches wait for their commits before the engine sees them, for a
while.

A batch is sent to the engine ahead of its settlement's commit only when the ledger writer's
estimate says its users can afford their queued bids (above). That
estimate cannot see another replica's spending, and a request sent ahead that the commit then
refuses voids its whole batch, other users' requests included. So a user one of whose holds was
refused (the budget spent meanwhile on another replica, a rid settled or held elsewhere) or
could not be claimed is distrusted for `seconds`: their batches wait for their commits.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from inference_auctions.server.engine.protocol import Generation

__all__ = ["BatchAhead", "Distrust"]

if TYPE_CHECKING:
    from inference_auctions.server.serving.dispatch import DeferredDispatch


@dataclass(eq=False)
class BatchAhead:
    """The engine's side of one batch sent ahead: its generations, their followers, and the
    commit's verdict (`settled`: True once settled as sent, False if void)."""

    engine_rids: Sequence[str]
    settled: asyncio.Future[bool] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )
    _generations: list[Generation] = field(default_factory=list, init=False)
    _followers: list[asyncio.Future[None]] = field(default_factory=list, init=False)

    def follow(self, generation: Generation, followed: asyncio.Future[None]) -> None:
        """A request of the batch was sent: its follower serves it once the commit says so;
        `followed` resolves once it let go of the request."""
        self._generations.append(generation)
        self._followers.append(followed)

    def confirm(self) -> None:
        """The commit settled the batch as sent: its followers carry on."""
        self.settled.set_result(True)

    async def void(self, dispatcher: DeferredDispatch) -> list[str]:
        """The commit did not settle the batch: stop it at the engine and wait until no
        follower holds any of its requests. Returns the engine rids never sent (the prefix
        deferral held them back), which no follower will report freed."""
        self.settled.set_result(False)
        dispatcher.withdraw(self.engine_rids)
        for generation in self._generations:
            generation.cancel("its batch is cleared again")
        await asyncio.gather(*self._followers, return_exceptions=True)
        sent = {generation.rid for generation in self._generations}
        return [rid for rid in self.engine_rids if rid not in sent]


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
