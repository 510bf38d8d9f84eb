"""Readers waiting for one kind of change of an object, each on a future of its own.

Every request creates objects that others wait on (its ticket, its engine generation), so
their signals must be cheap: no lock as in an `asyncio.Condition`, and nothing allocated until
somebody actually waits. A change resolves every future waiting at that moment, once; a
reader that is cancelled cancels only its own future.
"""

from __future__ import annotations

import asyncio

__all__ = ["Waiters"]


class Waiters:
    """The futures of the readers waiting for the next change (see the module docstring)."""

    __slots__ = ("_futures",)

    def __init__(self) -> None:
        self._futures: list[asyncio.Future[None]] = []

    def wait(self) -> asyncio.Future[None]:
        """A new future, resolved at the next `wake`."""
        future = asyncio.get_running_loop().create_future()
        self._futures.append(future)
        return future

    def wake(self) -> None:
        """Resolve every future waiting now (a cancelled one is skipped)."""
        futures, self._futures = self._futures, []
        for future in futures:
            if not future.done():
                future.set_result(None)
