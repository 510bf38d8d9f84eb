"""The overlap rule (`server.auction.wait_overlap`): both fast counts against the quadratic one."""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from inference_auctions.server.auction.wait_overlap import (
    PPM,
    DispatchHistory,
    Overlap,
    overlaps,
)

Key = tuple[float, int]  # a moment, then the order of dispatches made at that moment


def quadratic(spans: list[tuple[Key, Key]], served: list[bool]) -> list[Overlap]:
    """Obviously right and slow: for each served wait, every other wait that began before it
    ended and ended after it began; those ending later were served after it, those ending
    earlier before it if they were served (an unserved one that left before does not count)."""
    found = []
    for i, (start, end) in enumerate(spans):
        competitors = [
            j
            for j, (other_start, other_end) in enumerate(spans)
            if j != i and other_start < end and start < other_end
        ]
        after = sum(1 for j in competitors if spans[j][1] > end)
        before = sum(1 for j in competitors if spans[j][1] <= end and served[j])
        found.append(Overlap(after, before))
    return found


# Few distinct moments, so that ties, instants and shared ends are the common case.
_MOMENT = st.integers(min_value=0, max_value=12).map(float)
_SPAN = st.tuples(_MOMENT, _MOMENT | st.just(math.inf)).map(lambda s: (s[0], max(s)))


@given(st.lists(_SPAN, max_size=30))
def test_the_offline_count_is_the_quadratic_one(spans: list[tuple[float, float]]) -> None:
    keyed = [((start, 0), (end, 0)) for start, end in spans]
    assert overlaps(spans) == quadratic(keyed, [True] * len(spans))


def test_a_wait_served_at_once_or_alone_overlaps_what_spans_it() -> None:
    # 0: waits 0..10; 1: served the instant it came, while 0 waited; 2: 0..10 too; 3: alone.
    found = overlaps([(0, 10), (4, 4), (0, 10), (20, 25), (10, math.inf)])
    assert found[1] == Overlap(after=2, before=0)  # ahead of both the long waits
    assert found[0] == Overlap(after=0, before=2)  # the instant, and its twin ending with it
    assert found[3] == Overlap(after=1, before=0)  # the one never served
    assert found[4].share() == Fraction(0)  # never served: behind the one that came after it
    assert Overlap(0, 0).share() is None and Overlap(0, 0).share_ppm() is None
    assert Overlap(2, 1).share_ppm() == 666_666 and Overlap(1, 0).share_ppm() == PPM
    with pytest.raises(ValueError, match="wait 0 ends"):
        overlaps([(3.0, 2.0)])


@dataclass
class _Queue:
    """A queue driven by a script: requests join, leave, or go in heads, one moment each."""

    history: DispatchHistory
    spans: list[tuple[Key, Key]]
    served: list[bool]
    waiting: list[int]
    online: dict[int, Overlap]

    def join(self, moment: float) -> None:
        self.waiting.append(len(self.spans))
        self.spans.append(((moment, 0), (math.inf, 0)))
        self.served.append(False)

    def leave(self, moment: float, pick: int) -> None:
        if self.waiting:
            index = self.waiting.pop(pick % len(self.waiting))
            self.spans[index] = (self.spans[index][0], (moment, 0))

    def send(self, moment: float, picks: list[int]) -> None:
        head = [self.waiting.pop(pick % len(self.waiting)) for pick in picks if self.waiting]
        if not head:
            return
        joined = [self.spans[index][0][0] for index in head]
        for place, (index, overlap) in enumerate(
            zip(head, self.history.sent(joined, moment, len(self.waiting)), strict=True)
        ):
            self.spans[index] = (self.spans[index][0], (moment, 1 + place))
            self.served[index] = True
            self.online[index] = overlap


_STEP: st.SearchStrategy[tuple[str, list[int]]] = st.one_of(
    st.just(("join", [])),
    st.tuples(st.just("leave"), st.lists(st.integers(0, 50), min_size=1, max_size=1)),
    st.tuples(st.just("send"), st.lists(st.integers(0, 50), min_size=1, max_size=4)),
)


@given(st.lists(_STEP, max_size=60))
def test_the_servers_count_is_the_quadratic_one(script: list[tuple[str, list[int]]]) -> None:
    queue = _Queue(DispatchHistory(horizon=1_000), [], [], [], {})
    for moment, (step, picks) in enumerate(script):
        if step == "join":
            queue.join(float(moment))
        elif step == "leave":
            queue.leave(float(moment), picks[0])
        else:
            queue.send(float(moment), picks)
    expected = quadratic(queue.spans, queue.served)
    assert queue.online == {index: expected[index] for index in queue.online}


def test_one_at_a_time_from_a_deep_queue_still_tells_first_from_last() -> None:
    # The engine takes one request a dispatch: a place within the head says 1 for every
    # request; what each went ahead of in the queue says first 1, last 0.
    history = DispatchHistory()
    shares = [history.sent([0.0], 1.0 + k, 9 - k)[0].share() for k in range(10)]
    assert shares == [Fraction(9 - k, 9) for k in range(10)]


def test_the_history_keeps_its_horizon_and_no_more() -> None:
    history = DispatchHistory(horizon=4)
    for moment in range(100):
        history.sent([float(moment)], moment + 0.5, 0)
        assert len(history) < 8
    # Waited through all 100 dispatches: only the 4 to 7 kept count as served before it.
    assert 4 <= history.sent([-1.0], 200.0, 0)[0].before < 8
    # A clock that goes back is taken as the last time, never as an error.
    assert history.sent([150.0], 100.0, 0)[0] == Overlap(after=0, before=1)
    with pytest.raises(ValueError, match="horizon"):
        DispatchHistory(horizon=0)
