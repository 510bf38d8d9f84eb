"""The in-step prefix deferral rule, on hand-built batches and against a brute-force oracle."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from inference_auctions.server.auction import AuctionRequest, run_auction
from inference_auctions.server.serving.deferral import (
    BatchPrefixes,
    DeferralSettings,
    PrefixDeferral,
    Release,
)
from inference_auctions.server.serving.dispatch import deferral_settings
from inference_auctions.server.settings import ServerSettings

PREFIX = list(range(1000, 1100))  # 100 tokens


def _cleared(
    prompts: list[list[int]], bids: list[int] | None = None
) -> tuple[BatchPrefixes, list[str]]:
    bids = bids or [1] * len(prompts)
    outcome = run_auction(
        [
            AuctionRequest(f"r{i}", f"u{i}", p, b)
            for i, (p, b) in enumerate(zip(prompts, bids, strict=True))
        ]
    )
    return BatchPrefixes.from_outcome(outcome), outcome.order


def _keys(releases: list[Release[str]]) -> list[str]:
    return [release.key for release in releases]


def test_siblings_wait_for_the_first_and_then_reuse_its_prefix() -> None:
    prefixes, order = _cleared([[*PREFIX, i] for i in range(4)])
    rule: PrefixDeferral[str] = PrefixDeferral()
    assert rule.add_batch(prefixes, order, now=0.0) == order[:1]
    assert rule.holding == 3
    released = rule.first_token(order[0], now=2.5)
    assert _keys(released) == order[1:]  # in the auction's order
    assert all(r.held_seconds == 2.5 and r.saved_tokens == 100 for r in released)
    assert not any(r.expired for r in released)
    assert rule.holding == 0


def test_a_prefix_shorter_than_the_threshold_holds_nothing() -> None:
    short = PREFIX[:31]
    prefixes, order = _cleared([[*short, i] for i in range(4)])
    rule: PrefixDeferral[str] = PrefixDeferral(DeferralSettings(threshold_tokens=32))
    assert rule.add_batch(prefixes, order, now=0.0) == order
    prefixes, order = _cleared([[*PREFIX[:32], i] for i in range(4)])
    assert PrefixDeferral[str]().add_batch(prefixes, order, now=0.0) == order[:1]


def test_requests_of_other_subtrees_are_not_held() -> None:
    other = list(range(5000, 5100))
    prompts = [[*PREFIX, 1], [*other, 1], [*PREFIX, 2], [*other, 2], [7, 8, 9]]
    prefixes, order = _cleared(prompts, bids=[50, 40, 30, 20, 10])
    rule: PrefixDeferral[str] = PrefixDeferral()
    sent = rule.add_batch(prefixes, order, now=0.0)
    # The auction groups each subtree; the first of each and the singleton go at once.
    heads = {order[0], order[2], "r4"}
    assert set(sent) == heads
    assert sent == [key for key in order if key in heads]
    assert _keys(rule.first_token(order[2], now=1.0)) == [order[3]]
    assert _keys(rule.first_token(order[0], now=2.0)) == [order[1]]


def test_a_deeper_shared_prefix_is_waited_for_level_by_level() -> None:
    deeper = list(range(2000, 2050))  # 50 more tokens shared by two of the four
    prompts = [[*PREFIX, 1], [*PREFIX, *deeper, 1], [*PREFIX, *deeper, 2], [*PREFIX, 3]]
    prefixes, order = _cleared(prompts, bids=[4, 3, 2, 1])
    assert order == ["r0", "r1", "r2", "r3"]
    rule: PrefixDeferral[str] = PrefixDeferral()
    assert rule.add_batch(prefixes, order, now=0.0) == ["r0"]
    # r0 computed the 100 shared tokens; r2 still shares 50 new ones with r1, r3 none.
    released = rule.first_token("r0", now=1.0)
    assert _keys(released) == ["r1", "r3"]
    assert rule.holding == 1
    (last,) = rule.first_token("r1", now=3.0)
    assert (last.key, last.held_seconds, last.saved_tokens) == ("r2", 3.0, 150)


def test_a_hold_runs_out_after_the_bounded_wait() -> None:
    prefixes, order = _cleared([[*PREFIX, i] for i in range(3)])
    rule: PrefixDeferral[str] = PrefixDeferral(DeferralSettings(max_hold_seconds=5.0))
    rule.add_batch(prefixes, order, now=10.0)
    assert rule.next_deadline() == 15.0
    assert rule.expire(14.9) == []
    released = rule.expire(15.0)
    assert _keys(released) == order[1:]
    assert all(r.expired and r.saved_tokens == 0 and r.held_seconds == 5.0 for r in released)
    assert rule.next_deadline() is None
    assert rule.first_token(order[0], now=16.0) == []  # nothing left to release


def test_a_failed_request_releases_its_waiters_without_claiming_a_cached_prefix() -> None:
    prefixes, order = _cleared([[*PREFIX, i] for i in range(3)])
    rule: PrefixDeferral[str] = PrefixDeferral()
    rule.add_batch(prefixes, order, now=0.0)
    # The next sibling now computes the prefix itself, so the last waits on it.
    (released,) = rule.ended(order[0], now=1.0)
    assert (released.key, released.saved_tokens) == (order[1], 0)
    assert rule.holding == 1
    (last,) = rule.first_token(order[1], now=2.0)
    assert (last.key, last.saved_tokens) == (order[2], 100)


def test_a_zero_wait_turns_the_rule_off() -> None:
    prefixes, order = _cleared([[*PREFIX, i] for i in range(3)])
    rule: PrefixDeferral[str] = PrefixDeferral(DeferralSettings(max_hold_seconds=0))
    assert rule.add_batch(prefixes, order, now=0.0) == order


def test_bad_settings_and_inputs_are_refused() -> None:
    with pytest.raises(ValueError, match="threshold_tokens"):
        DeferralSettings(threshold_tokens=0)
    with pytest.raises(ValueError, match="max_hold_seconds"):
        DeferralSettings(max_hold_seconds=-1)
    prefixes, order = _cleared([[1, 2], [3]])
    rule: PrefixDeferral[str] = PrefixDeferral()
    with pytest.raises(ValueError, match="keys for a batch"):
        rule.add_batch(prefixes, order[:1], now=0.0)
    rule.add_batch(prefixes, order, now=0.0)
    with pytest.raises(ValueError, match="already in a batch"):
        rule.add_batch(prefixes, order, now=0.0)


# The oracle: compare prompts token by token, as the rule must never need to.


def _shared(a: list[int], b: list[int]) -> int:
    length = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        length += 1
    return length


def _blocked(
    prompts: list[list[int]], place: int, unfinished: set[int], computed: set[int], k: int
) -> bool:
    cached = max((_shared(prompts[place], prompts[q]) for q in computed), default=0)
    return any(_shared(prompts[place], prompts[p]) - cached >= k for p in unfinished if p < place)


_PROMPTS = st.lists(st.lists(st.integers(0, 2), max_size=8), max_size=14)


@settings(max_examples=300, deadline=None)
@given(_PROMPTS, st.lists(st.integers(0, 5)), st.integers(1, 3), st.data())
def test_the_rule_agrees_with_comparing_prompts(
    prompts: list[list[int]], bids: list[int], threshold: int, data: st.DataObject
) -> None:
    bids = [bids[i] if i < len(bids) else 1 for i in range(len(prompts))]
    outcome = run_auction(
        [
            AuctionRequest(str(i), "u", p, b)
            for i, (p, b) in enumerate(zip(prompts, bids, strict=True))
        ]
    )
    order = [int(rid) for rid in outcome.order]
    place_of = {index: place for place, index in enumerate(order)}
    by_place = [prompts[index] for index in order]
    rule: PrefixDeferral[int] = PrefixDeferral(DeferralSettings(threshold, max_hold_seconds=4))
    unfinished, computed, sent = set(range(len(order))), set(), set()

    def check_sent(keys: list[int]) -> None:
        for key in keys:
            place = place_of[key]
            # Never sent while an earlier request computes enough of its uncached prefix.
            assert not _blocked(by_place, place, unfinished, computed, threshold)
            sent.add(place)

    first = rule.add_batch(BatchPrefixes.from_outcome(outcome), order, now=0.0)
    check_sent(first)
    # At the batch's start the decision is exact: held exactly when blocked.
    for place in range(len(order)):
        assert (place in sent) != _blocked(
            by_place, place, set(range(len(order))), set(), threshold
        )
    now = 0.0
    while unfinished:
        # Each turn a running request ends, or time jumps to the next hold's end: no loops.
        running = sorted(unfinished & sent)
        # A hold that runs out before the next event is let go first, as the server's timer does.
        upcoming = rule.next_deadline()
        due = upcoming is not None and upcoming <= now + 1.0
        if running and not due and (rule.holding == 0 or data.draw(st.booleans())):
            now += 1.0
            place = data.draw(st.sampled_from(running))
            unfinished.discard(place)
            if data.draw(st.booleans()):
                computed.add(place)
                released = rule.first_token(order[place], now)
            else:
                released = rule.ended(order[place], now)
            check_sent([r.key for r in released])
        else:
            deadline = rule.next_deadline()
            assert deadline is not None and deadline >= now
            now = deadline
            released = rule.expire(now)
            assert released and all(r.expired for r in released)
            sent.update(place_of[r.key] for r in released)
        places = [place_of[r.key] for r in released]
        assert places == sorted(places)
    assert rule.holding == 0 and rule.next_deadline() is None


def test_the_server_settings_turn_the_rule_off_and_refuse_bad_values() -> None:
    on = deferral_settings(ServerSettings(deferral_tokens=64, deferral_max_hold_ms=1500))
    assert on == DeferralSettings(threshold_tokens=64, max_hold_seconds=1.5)
    assert deferral_settings(ServerSettings(deferral=False)) is None
    # Ordered mode never admits two requests into one prefill step: nothing to hold back.
    assert deferral_settings(ServerSettings(engine_mode="ordered")) is None
    with pytest.raises(ValidationError, match="deferral_tokens"):
        ServerSettings(deferral_tokens=0)
    with pytest.raises(ValidationError, match="deferral_max_hold_ms"):
        ServerSettings(deferral_max_hold_ms=-1)
