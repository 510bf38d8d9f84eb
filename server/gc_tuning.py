"""The garbage collector, set for a server that allocates a little per request and keeps a
large heap.

CPython's cycle collector runs its youngest generation every 700 net allocations and, now and
then, a full collection that traverses every object it tracks: the tens of thousands that the
imports and the startup built (FastAPI, SQLAlchemy, numpy) and, under load, the tickets
remembered for retries. At 20 connections that was about a full collection every few seconds
(tens of milliseconds each, a pause for every request in flight) and some 5% of the server's
CPU. Once the server has started it therefore freezes what exists (`gc.freeze`: kept out of
every later collection, still freed by reference counting) and collects the youngest
generation every 10,000 allocations instead: 4-6% less CPU per request at 20 connections
(docs/PERFORMANCE.md).
"""

from __future__ import annotations

import gc

__all__ = ["YOUNG_THRESHOLD", "tune_collector"]

# Allocations (net) between two collections of the youngest generation; ten of those make
# one of the middle generation, ten of those one full collection.
YOUNG_THRESHOLD = 10_000


def tune_collector() -> None:
    """Freeze the heap built so far and collect the young generation less often."""
    gc.collect()  # what the startup left as garbage goes now, not into the frozen heap
    gc.freeze()
    gc.set_threshold(YOUNG_THRESHOLD, 10, 10)
