"""What an order achieved: welfare on the realized order, cache hit rate, mean TTFT.

Welfare is measured as the paper does, on the order the engine actually produced: queries
ranked by time to first token across the whole queue, the first getting fractional priority 1
and the last 0. Queries whose first tokens come out of the same prefill step tie; they share
the average of the priorities they span, so no order gains from how a step lists its requests.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

__all__ = [
    "mean_and_stderr",
    "realized_priorities",
    "welfare",
    "welfare_gain_percent",
]


def realized_priorities(ttfts: Sequence[float]) -> list[float]:
    """Fractional priority of each query when ranked by TTFT, ties sharing their average."""
    n = len(ttfts)
    if n == 1:
        return [1.0]
    ranked = sorted(range(n), key=ttfts.__getitem__)
    priorities = [0.0] * n
    start = 0
    while start < n:
        end = start
        while end + 1 < n and ttfts[ranked[end + 1]] == ttfts[ranked[start]]:
            end += 1
        # Positions start..end share the mean of (n-1-k)/(n-1) over k in that range.
        shared = (n - 1 - (start + end) / 2) / (n - 1)
        for k in range(start, end + 1):
            priorities[ranked[k]] = shared
        start = end + 1
    return priorities


def welfare(bids: Sequence[int], priorities: Sequence[float]) -> float:
    """W = sum of bid times fractional priority."""
    return math.fsum(b * x for b, x in zip(bids, priorities, strict=True))


def welfare_gain_percent(bids: Sequence[int], priorities: Sequence[float]) -> float:
    """Welfare as a percentage above half the bids: a random order's expected welfare."""
    half = sum(bids) / 2
    if half == 0:
        return 0.0
    return 100.0 * (welfare(bids, priorities) / half - 1.0)


def mean_and_stderr(samples: Sequence[float]) -> tuple[float, float]:
    """Mean and one standard error of the mean (0 for a single sample)."""
    n = len(samples)
    if n == 0:
        raise ValueError("no samples")
    mean = math.fsum(samples) / n
    if n == 1:
        return mean, 0.0
    variance = math.fsum((s - mean) ** 2 for s in samples) / (n - 1)
    return mean, math.sqrt(variance / n)
