"""A record of every rolling clearing, so that its charges can be priced again offline.

One JSON line per clearing that sent a head of bidders: when (`at`, UTC), the slots it priced
in, the pool it ordered (each request's rid, user, bid and tree path, in arrival order: the
paths, used as prompts, rebuild a tree of the pool's shape), the head it sent, in the pool's
order, and each of the head's users' charge; under a posted price floor, the floor in force
(`price_floor_micros`, the level the clearing priced with, before its step) and each entrant's
part of it (`floors`). `rolling.order_pool` and
`rolling.rolling_charges` over those requests give the same charges (a test checks it against
a live server, and the brute-force oracle on small pools).

Under a posted floor every clearing writes its line, also one that sends no entrant (an empty
head and no charges): the floor takes its step after every clearing, so each line's level is
`price_floor.next_floor` of the line before's level and pool depth, and the log holds the
floor's whole path. Without a floor, a clearing that sends no bidder prices nothing and moves
nothing: it writes no line.

Off by default (`clearing_log`): a line holds the whole pool, which is large under a deep
backlog. Written from the event loop; the file is flushed by line.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import orjson

__all__ = ["ClearingLog"]


class ClearingLog:
    """Appends one line per clearing to `path` (see the module docstring)."""

    def __init__(self, path: Path) -> None:
        self._file = path.open("ab", buffering=0)

    def write(
        self,
        slots: int,
        pool: list[dict[str, object]],
        head: list[str],
        charges: dict[str, int],
        floor: int | None = None,
        floors: dict[str, int] | None = None,
    ) -> None:
        record: dict[str, object] = {
            "at": datetime.now(UTC).isoformat(),
            "slots": slots,
            "pool": pool,
            "head": head,
            "charges": charges,
        }
        if floor is not None:
            # The floor in force at this clearing, and each entrant's part of it.
            record["price_floor_micros"] = floor
            record["floors"] = floors or {}
        self._file.write(orjson.dumps(record) + b"\n")

    def close(self) -> None:
        self._file.close()
