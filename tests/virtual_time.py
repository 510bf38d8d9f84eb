"""An asyncio event loop on a virtual clock, for tests of logic that waits on the loop's timers.

`loop.time()` starts at 0 and moves only when the loop would otherwise block: it then jumps to
its next timer at once. Everything timed by the loop (`asyncio.sleep`, `asyncio.timeout`,
`loop.call_at`) runs in the order and at the moments the code asks for, however loaded the
machine, and a test of a 0.3 s deadline takes no real time. I/O and callbacks from threads
still arrive (the loop polls its real selector first), but a thread's work takes no virtual
time: use it for code whose waits are the loop's own timers.

A test module selects it with
`anyio_backend = pytest.fixture(lambda: ("asyncio", {"loop_factory": VirtualTimeLoop}))`
and reads the clock with `asyncio.get_running_loop().time()`.
"""

from __future__ import annotations

import asyncio
import selectors
from typing import Any


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0


class _InstantSelector:
    """A real selector whose waits with a timeout advance the virtual clock instead."""

    def __init__(self, clock: _Clock) -> None:
        self._real = selectors.DefaultSelector()
        self._clock = clock

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        ready = self._real.select(0)
        if ready or timeout == 0:
            return ready
        if timeout is None:  # no timer at all: only I/O or another thread can wake the loop
            return self._real.select(None)
        self._clock.now += timeout
        return []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """The event loop of the module docstring."""

    def __init__(self) -> None:
        self._clock = _Clock()
        super().__init__(_InstantSelector(self._clock))  # type: ignore[arg-type]

    def time(self) -> float:
        return self._clock.now
