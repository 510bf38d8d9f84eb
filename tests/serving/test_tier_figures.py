"""What each tier publishes (`server.serving.tiers.TierFigures`), fed dispatch by dispatch."""

from __future__ import annotations

from inference_auctions.server.serving.tiers import PPM, TierFigures, Waited, parse_tiers

MENU = parse_tiers("flex=0,priority=0.01", maximum=10**9)


def test_before_any_traffic_each_tier_gets_its_share_of_an_even_split() -> None:
    figures = TierFigures(MENU)
    assert figures.expected_priority_ppm("priority") == 750_000
    assert figures.expected_priority_ppm("flex") == 250_000
    assert figures.samples("flex") == 0 and figures.recent_wait_ms("flex") is None


def test_one_request_a_dispatch_from_a_backlog_still_separates_the_tiers() -> None:
    # Ten wait from 0 s (five of each tier); the engine takes one at a time, dearest first.
    figures = TierFigures(MENU)
    order = ["priority"] * 5 + ["flex"] * 5
    for place, tier in enumerate(order):
        figures.sent([Waited(tier, 0.0, 0.0)], 1.0 + place, len(order) - 1 - place)
    # The priority requests went ahead of 9..5 of their 9 competitors, flex of 4..0.
    assert (
        figures.expected_priority_ppm("priority") == sum(k * PPM // 9 for k in (9, 8, 7, 6, 5)) // 5
    )
    assert figures.expected_priority_ppm("flex") == sum(k * PPM // 9 for k in (4, 3, 2, 1, 0)) // 5
    assert figures.recent_wait_ms("priority") == 3_000  # waits 1..5 s
    assert figures.recent_wait_ms("flex") == 8_000  # waits 6..10 s
    assert figures.samples("priority") == 5


def test_a_request_nobody_waited_beside_lost_nothing_and_the_window_forgets() -> None:
    figures = TierFigures(MENU, window=3)
    figures.sent([Waited("flex", 0.0, 0.0)], 0.5, 0)  # alone: 1
    assert figures.expected_priority_ppm("flex") == PPM
    for moment in range(1, 5):  # each time a request of no tier goes ahead of a flex one
        figures.sent([Waited(None, moment - 0.2, moment - 0.2)], moment + 0.2, 1)
        figures.sent([Waited("flex", moment - 0.1, moment - 0.1)], moment + 0.3, 0)
    # Only the last three count: each went ahead of none of its one competitor, which counts
    # though it has no tier to publish for.
    assert figures.samples("flex") == 3
    assert figures.expected_priority_ppm("flex") == 0
    assert figures.recent_wait_ms("flex") == 400
