"""Metrics on hand-computed cases: realized priorities with ties, welfare, standard errors."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from inference_auctions.experiments.metrics import (
    mean_and_stderr,
    realized_priorities,
    welfare,
    welfare_gain_percent,
)


def test_priorities_rank_by_ttft() -> None:
    # Ranks by TTFT: c (0.5 s), a (1 s), b (3 s); first gets 1, last 0.
    assert realized_priorities([1.0, 3.0, 0.5]) == [0.5, 0.0, 1.0]
    assert realized_priorities([7.0]) == [1.0]


def test_ties_share_the_average_of_their_priorities() -> None:
    # Positions 0..4 carry 1, 3/4, 1/2, 1/4, 0; the three tied at 2 s take (3/4+1/2+1/4)/3.
    assert realized_priorities([2.0, 1.0, 2.0, 9.0, 2.0]) == [0.5, 1.0, 0.5, 0.0, 0.5]


def test_welfare_and_its_gain_over_half_the_bids() -> None:
    bids = [10, 30, 60]
    priorities = realized_priorities([3.0, 2.0, 1.0])  # highest bid first: 60, 30, 10
    assert welfare(bids, priorities) == pytest.approx(60 + 15)
    assert welfare_gain_percent(bids, priorities) == pytest.approx(100 * (75 / 50 - 1))
    assert welfare_gain_percent(bids, [0.0, 0.5, 1.0][::-1]) == pytest.approx(100 * (25 / 50 - 1))
    assert welfare_gain_percent([0, 0], [1.0, 0.0]) == 0.0


def test_mean_and_standard_error() -> None:
    mean, error = mean_and_stderr([1.0, 2.0, 6.0])
    assert mean == 3.0
    assert error == pytest.approx(math.sqrt(7 / 3))  # sample variance 7, over n = 3
    assert mean_and_stderr([4.0]) == (4.0, 0.0)
    with pytest.raises(ValueError, match="no samples"):
        mean_and_stderr([])


@given(st.lists(st.integers(min_value=0, max_value=5), min_size=2, max_size=40))
def test_priorities_average_one_half_and_follow_ttft(ttfts: list[int]) -> None:
    priorities = realized_priorities([float(t) for t in ttfts])
    assert math.fsum(priorities) == pytest.approx(len(ttfts) / 2)
    for a, pa in zip(ttfts, priorities, strict=True):
        for b, pb in zip(ttfts, priorities, strict=True):
            if a < b:
                assert pa > pb
            elif a == b:
                assert pa == pb
