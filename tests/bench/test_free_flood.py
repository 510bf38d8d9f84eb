"""bench.free_flood runs paying traffic alone and beside a flood, on a real server and emulator."""

from __future__ import annotations

from pathlib import Path

import pytest
from rich.console import Console

from bench.free_flood import Flood, Plan, _arguments, run, table


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


def test_the_real_sglang_runs_in_real_time_with_prompts_its_model_can_hold() -> None:
    plan = _arguments(["--engine", "sglang", "--time-scale", "0.2"])
    assert plan.engine == "sglang" and plan.time_scale == 1.0
    assert plan.floods["long prompts"].prompt_words == 300  # about 1,600 of 2,048 positions
    assert _arguments([]).floods["long prompts"].prompt_words == 5_000  # the emulator's
    with pytest.raises(SystemExit):
        _arguments(["--engine", "sglang", "--long-prompt-words", "5000"])
