"""The timing study (`experiments.timing`): its utilities against a slow copy written apart
(`timing_oracle`), the floor's steps, and a small run of the whole study through the CLI."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from inference_auctions.experiments.timing import (
    BURST_TRUTHFUL,
    DEVIATIONS,
    TRUTHFUL,
    TimingSetup,
    build_market,
    study_target,
    summarize,
)
from inference_auctions.experiments.timing_model import RULES, next_floor
from inference_auctions.server.cli.experiment_command import experiment
from tests.experiments.timing_oracle import oracle_utility, sample_targets

SMALL = TimingSetup(loads=(1.5,), seeds=(1,), targets=4, warmup=14, span=6)
CHECKED = (
    TRUTHFUL,
    BURST_TRUTHFUL,
    *(
        d
        for d in DEVIATIONS
        if d.name
        in {"bid x0.3", "bid x4", "late +2", "x0.25, after 2 x2", "burst, x5", "16 decoys"}
    ),
)


@pytest.fixture(scope="module")
def market():  # type: ignore[no-untyped-def]
    return build_market(SMALL, 1, 1.5)


def test_the_study_utilities_equal_the_slow_copy(market) -> None:  # type: ignore[no-untyped-def]
    targets = sample_targets(market, 5)
    checked = 0
    for target in targets:
        result = study_target(market, target, 1, 1.5)
        for deviation in CHECKED:
            for rule in RULES:
                fast = result.utilities[rule][deviation.name]
                slow = oracle_utility(market, target, deviation, rule)
                assert fast == slow, (target.rid, deviation.name, rule)
                checked += 1
    assert checked == 5 * len(CHECKED) * len(RULES)


def test_a_deviation_that_changes_nothing_gains_nothing(market) -> None:  # type: ignore[no-untyped-def]
    (target,) = sample_targets(market, 1)
    result = study_target(market, target, 1, 1.5)
    for rule in RULES:
        # Sent 40 slots late its value is gone: it is withdrawn unpaid, worth exactly 0.
        assert result.utilities[rule]["late +40"] == 0
        assert result.gain(rule) >= 0


def test_the_floor_moves_by_at_most_an_eighth_towards_its_target() -> None:
    assert next_floor(800, 32, 16) == 900  # twice the target: up an eighth
    assert next_floor(800, 64, 16) == 900  # the step is bounded however deep the pool
    assert next_floor(800, 0, 16) == 700
    assert next_floor(800, 16, 16) == 800
    assert next_floor(800, 24, 16) == 850
    assert next_floor(1, 0, 16) == 0  # down to zero, where every positive bid enters
    assert next_floor(0, 0, 16) == 0  # never below it
    assert next_floor(0, 17, 16) == 1  # and up from it by a micro-credit
    assert next_floor(3, 17, 16) == 4  # at least one micro-credit a step


def test_a_small_study_reports_every_rule(market, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    results = [study_target(market, t, 1, 1.5) for t in sample_targets(market, 2)]
    for rule in RULES:
        row = summarize(rule, 1.5, results, [market])
        assert 0 <= row.material <= row.profitable <= 1
        assert row.worst_seed == row.profitable  # one seed
        assert row.p90_gain >= row.median_gain >= 0
        assert 0 < row.welfare <= 100
    # The at-dispatch rule and the settled charge order alike: the same welfare.
    assert market.welfare["dispatch"] == market.welfare["horizon"]


def test_the_cli_runs_the_quick_study(tmp_path: Path) -> None:
    outcome = CliRunner().invoke(
        experiment, ["manipulation", "--timing", "--quick", "--out", str(tmp_path)]
    )
    assert outcome.exit_code == 0, outcome.output
    table = (tmp_path / "timing.md").read_text(encoding="utf-8")
    for name in ("(a) at-dispatch charge", "(b) + posted floor", "(c) settled over a horizon"):
        assert table.count(name) == 3  # one row per load
    assert (tmp_path / "timing.png").stat().st_size > 0


def test_timing_is_only_for_the_manipulation_target(tmp_path: Path) -> None:
    outcome = CliRunner().invoke(experiment, ["live", "--timing", "--out", str(tmp_path)])
    assert outcome.exit_code != 0
    assert "--timing is for the manipulation target only" in outcome.output
