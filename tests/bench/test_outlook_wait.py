"""bench.outlook_wait probes a loaded server with the SDK's outlook and times the real waits."""

from __future__ import annotations

from pathlib import Path

from bench.outlook_wait import Plan, run, table


def test_the_benchmark_compares_the_estimates_with_real_waits(tmp_path: Path) -> None:
    plan = Plan(
        seconds=5.0,
        warmup=1.5,
        load=1.3,
        running=4,
        time_scale=0.2,
        new_tokens=16,
        probe_every=0.5,
        users=4,
        seed=1,
        serve_options=(),
    )
    probes, capacity = run(plan, tmp_path)
    assert capacity > 0
    assert len(probes) >= 6
    # Every probe was served and timed; the bench's own estimate exists once starts were seen.
    assert all(p.real is not None and p.real > 0 for p in probes)
    assert all(p.client is not None and p.client >= 0 for p in probes)
    assert all(p.client == p.ahead / p.rate for p in probes if p.client is not None)
    # The outlook's own estimate needs the server's pool figures: none or non-negative.
    assert all(p.outlook is None or p.outlook >= 0 for p in probes)
    assert table(probes).row_count == 9
