"""Starvation inside a subtree (`experiments.starvation`): the rolling auction lets a stream of
higher-average subtrees overtake a valuable request under a large low-bid prefix for as long as
the stream lasts; filing cached prefixes apart serves it at once."""

from __future__ import annotations

from inference_auctions.experiments.starvation import STREAM, measure, starvation_table


def test_a_valuable_request_under_a_low_subtree_waits_out_the_stream() -> None:
    now = measure(1, 1.2, fix=False)
    assert now.wait is not None
    assert now.wait >= STREAM  # overtaken at every clearing while the stream arrived


def test_filing_cached_prefixes_apart_serves_it_in_its_first_slot() -> None:
    fixed = measure(1, 1.2, fix=True)
    assert fixed.wait == 0
    assert fixed.welfare > measure(1, 1.2, fix=False).welfare


def test_under_light_load_the_wait_is_bounded_without_the_fix() -> None:
    light = measure(1, 0.9, fix=False)
    assert light.wait is not None
    assert light.wait < 64 // 8  # within the K-1 positions a bid values


def test_the_table_has_both_orders_at_every_load() -> None:
    table = starvation_table(1, loads=(1.0, 1.5))
    assert table.count("rolling auction (now)") == 2
    assert table.count("cached prefixes filed apart") == 2
