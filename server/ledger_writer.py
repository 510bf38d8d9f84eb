"""Group commit: the one thread through which the serving path writes to the ledger.

A request used to cost two write transactions of its own (its hold, then its `served` record),
each started from a thread of the shared pool. On SQLite they queued on the database's single
write lock and spent more time waiting for it, and in the ORM around it, than writing.

Now every write of the serving path goes through one thread, in order:

* holds that arrive while a commit is running are placed together in the next one
  (`Ledger.commit_group`: one transaction, each hold still decided against what its user has
  available when its turn in the group comes, so nothing overspends);
* `served` records likewise, in the same transaction (`Ledger.commit_group`; each record still
  conditional on the request being `scheduled`, so recovery and serving still race safely);
* the rarer writes (a batch's claim, auction and settlement, a failure's refund, a release) run
  on the same thread between the groups (`call`).

A request waits for at most one commit in progress before its own is written, and the event
loop hands work to the thread once per group, not once per request.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any, TypeVar

from inference_auctions.billing import HoldRequest, HoldView, Ledger, ServedRecord

__all__ = ["LedgerWriter"]

T = TypeVar("T")

# A bound on one transaction, so a flood of holds cannot build one commit that blocks the
# settlements behind it for long; what is left goes into the next commit at once.
_MAX_GROUP = 512


class LedgerWriter:
    """Groups the serving path's ledger writes onto one thread (see the module docstring)."""

    def __init__(
        self,
        ledger: Ledger,
        *,
        max_group: int = _MAX_GROUP,
        observe_group: Callable[[int], None] = lambda _: None,
    ) -> None:
        self._ledger = ledger
        self._observe_group = observe_group  # writes per committed group, for the metrics
        self._max_group = max_group
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ledger-writer")
        self._holds: list[tuple[HoldRequest, asyncio.Future[HoldView]]] = []
        self._served: list[tuple[ServedRecord, asyncio.Future[bool]]] = []
        self._flusher: asyncio.Task[None] | None = None

    async def hold(self, request: HoldRequest) -> HoldView:
        """Place one hold in the next group commit; raises what `Ledger.place_hold` raises."""
        future: asyncio.Future[HoldView] = asyncio.get_running_loop().create_future()
        self._holds.append((request, future))
        self._kick()
        return await future

    async def served(self, record: ServedRecord) -> bool:
        """Record one request served in the next group commit; False if it was no longer
        `scheduled` (recovery recorded it unserved first)."""
        future: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._served.append((record, future))
        self._kick()
        return await future

    async def call(self, work: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run another ledger write on the writer thread, in turn with the groups."""
        return await asyncio.get_running_loop().run_in_executor(
            self._thread, partial(work, *args, **kwargs)
        )

    async def close(self) -> None:
        """Commit what is queued, then stop the thread."""
        while self._flusher is not None:
            await asyncio.shield(self._flusher)
        self._thread.shutdown(wait=True)

    def _kick(self) -> None:
        if self._flusher is None:
            self._flusher = asyncio.get_running_loop().create_task(
                self._flush(), name="ledger-group-commit"
            )

    async def _flush(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while self._holds or self._served:
                holds = self._holds[: self._max_group]
                del self._holds[: len(holds)]
                served = self._served[: self._max_group]
                del self._served[: len(served)]
                hold_results, served_results = await loop.run_in_executor(
                    self._thread,
                    self._commit,
                    [request for request, _ in holds],
                    [record for record, _ in served],
                )
                _settle(holds, hold_results)
                _settle(served, served_results)
        finally:
            self._flusher = None
            if self._holds or self._served:  # arrived after the last check: never stranded
                self._kick()

    def _commit(
        self, holds: list[HoldRequest], served: list[ServedRecord]
    ) -> tuple[list[HoldView | BaseException], list[bool | BaseException]]:
        """Both groups in one transaction; if it fails, every request of the group gets the
        error (nothing of it was written)."""
        try:
            placed, recorded = self._ledger.commit_group(holds, served)
        except Exception as error:
            return [error] * len(holds), [error] * len(served)
        self._observe_group(len(holds) + len(served))
        return list(placed), list(recorded)


def _settle(
    waiting: list[tuple[Any, asyncio.Future[Any]]], results: list[Any] | list[BaseException]
) -> None:
    """Hand each waiter its result; one that gave up meanwhile is skipped."""
    for (_, future), result in zip(waiting, results, strict=True):
        if future.done():
            continue
        if isinstance(result, BaseException):
            future.set_exception(result)
        else:
            future.set_result(result)
