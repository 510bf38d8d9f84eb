"""bench.pool_clearing runs the serving path's clearing, and its reference, on a small pool."""

from __future__ import annotations

from bench.pool_clearing import from_scratch, measure


def test_the_benchmark_clears_a_kept_pool_and_its_reference() -> None:
    kept = measure(32, clearings=5, head=4, prefill=8_192, users=4)
    anew = from_scratch(32, clearings=2, head=4, users=4)
    assert len(kept) == 5 and len(anew) == 2
    assert all(ms > 0 for ms in [*kept, *anew])
