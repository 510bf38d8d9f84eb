"""bench.free_flood runs paying traffic alone and beside a flood, on a real server and emulator."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from bench.free_flood import Flood, Plan, run, table


def test_the_benchmark_measures_paying_requests_alone_and_under_a_flood(tmp_path: Path) -> None:
    plan = Plan(
        time_scale=0.05,
        phase_seconds=4.0,
        paying_users=2,
        paying_rate=2.0,
        free_users=3,
        floods={"long prompts": Flood(rate=2.0, prompt_words=2_000, new_tokens=1)},
        settings=["idle"],
        seed=1,
    )
    results = run(plan, tmp_path, Console(quiet=True))
    phases = results["idle"]
    assert list(phases) == ["none", "long prompts"]
    for latencies in phases.values():
        assert len(latencies.end_to_end) == 8 and latencies.failed == 0
        assert all(
            0 < ttft < e2e
            for ttft, e2e in zip(latencies.first_token, latencies.end_to_end, strict=True)
        )
    assert phases["none"].free_sent == 0 and phases["long prompts"].free_sent > 0
    assert table(results, plan).row_count == 2
