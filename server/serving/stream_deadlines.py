"""The stall and total deadlines of every stream a server follows, on one timer.

Every stream has the same stall period and the same total cap (the server's settings), so the
streams ordered by when they last waited for a chunk are also ordered by their stall
deadlines, and the streams ordered by when they started are ordered by their total deadlines.
Two insertion-ordered dicts keep those two orders at O(1) per chunk (a stream that waits
again moves to the end), and one timer, armed for the earliest deadline of all, expires what
is due when it fires and re-arms for the next. A stream expires through its own timeout scope,
rescheduled to now, so the `anext` it awaits raises `TimeoutError` exactly as a timeout of its
own would: the deadlines are those of a fresh `asyncio.timeout(min(stall, cap left))` per
chunk, without a timer per stream or per chunk.
"""

from __future__ import annotations

import asyncio

__all__ = ["StreamDeadlines", "Watch"]


class Watch:
    """One stream's place in `StreamDeadlines`."""

    __slots__ = ("_owner", "cap_at", "capped", "scope", "since")

    def __init__(
        self, owner: StreamDeadlines, scope: asyncio.Timeout, now: float, cap_at: float | None
    ) -> None:
        self._owner = owner
        self.scope = scope
        self.since = now  # when it last started waiting for a chunk
        self.cap_at = cap_at
        self.capped = False  # expired by the total cap (else, if expired, by the stall)

    def waiting(self) -> None:
        """The next chunk is awaited from now: its stall deadline starts now."""
        self._owner._waiting(self)

    def cancel(self) -> None:
        """The stream ended (or timed out): no deadline applies to it any more."""
        self._owner._forget(self)


class StreamDeadlines:
    """The deadlines of every stream of a server (see the module docstring)."""

    def __init__(self, stall: float, cap: float | None) -> None:
        self._stall = stall
        self._cap = cap
        self._by_wait: dict[Watch, None] = {}  # in the order they last started waiting
        self._by_start: dict[Watch, None] = {}  # in the order they started (with a cap only)
        self._timer: asyncio.TimerHandle | None = None
        self._armed_at = 0.0

    def __len__(self) -> int:
        return len(self._by_wait)

    def watch(self, scope: asyncio.Timeout) -> Watch:
        """Follow a stream that starts now and waits for its first chunk; `scope` is the
        timeout scope around it, expired when a deadline passes."""
        loop = asyncio.get_running_loop()
        now = loop.time()
        watch = Watch(self, scope, now, None if self._cap is None else now + self._cap)
        self._by_wait[watch] = None
        if watch.cap_at is not None:
            self._by_start[watch] = None
        self._arm(loop)
        return watch

    def _waiting(self, watch: Watch) -> None:
        if self._by_wait.pop(watch, False) is not False:  # still followed: to the end
            watch.since = asyncio.get_running_loop().time()
            self._by_wait[watch] = None

    def _forget(self, watch: Watch) -> None:
        self._by_wait.pop(watch, None)
        self._by_start.pop(watch, None)
        # The timer stays armed: it finds nothing due, and re-arms or stops.

    def _due(self) -> float | None:
        """The earliest deadline of every stream followed, or None when there is none."""
        due = None
        if self._by_wait:
            due = next(iter(self._by_wait)).since + self._stall
        if self._by_start:
            cap_at = next(iter(self._by_start)).cap_at
            assert cap_at is not None
            due = cap_at if due is None else min(due, cap_at)
        return due

    def _arm(self, loop: asyncio.AbstractEventLoop) -> None:
        due = self._due()
        if due is None:
            return
        if self._timer is not None:
            if self._armed_at <= due:
                return  # it fires first anyway, and re-arms then
            self._timer.cancel()
        self._armed_at = due
        self._timer = loop.call_at(due, self._fire)

    def _fire(self) -> None:
        loop = asyncio.get_running_loop()
        now = loop.time()
        # Due: whatever was due when the timer was armed for this moment, even if the clock
        # reads a hair before it.
        limit = max(now, self._armed_at)
        self._timer = None
        # The cap first: a stream past both deadlines counts as capped.
        while self._by_start:
            first = next(iter(self._by_start))
            assert first.cap_at is not None
            if first.cap_at > limit:
                break
            first.capped = True
            self._expire(first, now)
        while self._by_wait:
            first = next(iter(self._by_wait))
            if first.since + self._stall > limit:
                break
            self._expire(first, now)
        self._arm(loop)

    def _expire(self, watch: Watch, now: float) -> None:
        self._forget(watch)
        watch.scope.reschedule(now)
