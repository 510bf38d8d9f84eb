"""What a request got against the requests that waited beside it: its share of them served after it.

A request waits from when it joins the queue until it is served (the server: sent to the
engine; the live experiment: its first token). Two requests compete when their waits overlap,
each beginning before the other ends. A request's `Overlap` counts its competitors: `after`,
those served after it, and `before`, those served before it (or at the same moment); its
share is `after / (after + before)`, the share of its competitors it went ahead of, or None
when nobody waited beside it. Unlike a place within the batch it was sent in, the share sees
the whole queue a request waited in, however few requests each dispatch takes: sent first of
a queue of ten, it went ahead of nine, even when each dispatch takes one.

The rule is counted two ways, each checked against the obvious quadratic count in the tests:

* `overlaps`: every wait at once, when all are known (the experiments, after a run);
  O(n log n).
* `DispatchHistory`: as the server sends requests on, one dispatch after another, without
  keeping their waits: a request's `before` is the dispatches since it joined the queue (a
  binary search in the recent dispatch times), its `after` the requests still in the queue
  when it goes (the caller's count), which are all sent after it or leave unserved. A request
  that leaves the queue unserved thus counts for those sent while it waited as one they went
  ahead of, and for nobody else. O(log n) a request, in bounded memory.
"""

from __future__ import annotations

import math
from array import array
from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction

__all__ = ["PPM", "DispatchHistory", "Overlap", "overlaps"]

PPM = 1_000_000


@dataclass(frozen=True, slots=True)
class Overlap:
    """A request's competitors: those served after it, and those served before it."""

    after: int
    before: int

    @property
    def competitors(self) -> int:
        """The requests whose waits overlapped its own."""
        return self.after + self.before

    def share(self) -> Fraction | None:
        """The share of its competitors served after it; None when it had none."""
        return None if not self.competitors else Fraction(self.after, self.competitors)

    def share_ppm(self) -> int | None:
        """`share` in parts per million, rounded down; None when it had no competitor."""
        return None if not self.competitors else self.after * PPM // self.competitors


def overlaps(spans: Sequence[tuple[float, float]]) -> list[Overlap]:
    """The overlap of each wait `(start, end)`, in the order given. An end may be infinite
    (never served: served after everyone); waits that end at the same moment count each other
    as served before. Raises ValueError for a wait that ends before it starts.

    A sweep over the starts and ends in time order: when waits end, those still waiting are
    served after them, and the ends since each one's start were served before it. At one
    moment, ends come first (a wait that ends as another starts does not overlap it), then
    waits that start and end there (they overlap only the waits that span them), then starts.
    """
    events: list[tuple[float, int, int]] = []
    for index, (start, end) in enumerate(spans):
        if not start <= end:
            raise ValueError(f"wait {index} ends ({end}) before it starts ({start})")
        if start == end:
            events.append((start, _INSTANT, index))
        else:
            events += [(start, _START, index), (end, _END, index)]
    events.sort()
    found: list[Overlap | None] = [None] * len(spans)
    ended_before_start = [0] * len(spans)  # ends seen when each wait started
    waiting = ended = 0
    place = 0
    while place < len(events):
        moment = events[place][0]
        kinds: tuple[list[int], list[int], list[int]] = ([], [], [])
        while place < len(events) and events[place][0] == moment:
            _, kind, index = events[place]
            kinds[kind].append(index)
            place += 1
        ending, instants, starting = kinds
        for index in ending:
            found[index] = Overlap(
                after=waiting - len(ending),
                before=ended - ended_before_start[index] + len(ending) - 1,
            )
        waiting -= len(ending)
        for index in instants:
            found[index] = Overlap(after=waiting, before=0)
        ended += len(ending) + len(instants)
        for index in starting:
            ended_before_start[index] = ended
        waiting += len(starting)
    assert all(overlap is not None for overlap in found)
    return [overlap for overlap in found if overlap is not None]


# The order of events at one moment (see `overlaps`).
_END, _INSTANT, _START = 0, 1, 2


class DispatchHistory:
    """The server's count of `Overlap`s, dispatch by dispatch (see the module docstring).

    It keeps the times of the last `horizon` to `2 x horizon` dispatches: a request that waited
    through more counts only those as served before it (its share is then slightly high, for
    a request that waited longest of all). Dispatch times must not go back; one that does is
    taken as the last (a clock is never trusted to raise on the serving path)."""

    def __init__(self, horizon: int = 65_536) -> None:
        if horizon < 1:
            raise ValueError(f"horizon must be at least 1, not {horizon}")
        self._horizon = horizon
        self._times = array("d")  # the dispatch times kept, oldest first (8 bytes each)

    def sent(self, joined: Sequence[float], at: float, still_waiting: int) -> list[Overlap]:
        """The overlaps of a head sent at `at`, in the order it is sent (earlier in the head
        goes first), whose requests joined the queue at `joined`; `still_waiting` requests
        stay in the queue, to be sent after it (or to leave unserved)."""
        if still_waiting < 0:
            raise ValueError(f"still_waiting must be at least 0, not {still_waiting}")
        if math.isnan(at):
            raise ValueError("a dispatch time must be a number")
        times = self._times
        if times and at < times[-1]:
            at = times[-1]
        found: list[Overlap] = []
        for place, start in enumerate(joined):
            # Every dispatch since it joined (those kept), this head's earlier ones included.
            before = len(times) - bisect_right(times, start)
            found.append(Overlap(after=still_waiting + len(joined) - 1 - place, before=before))
            times.append(at)
        if len(times) >= 2 * self._horizon:
            del times[: len(times) - self._horizon]  # amortised: once every `horizon` dispatches
        return found

    def __len__(self) -> int:
        """The dispatch times kept."""
        return len(self._times)
