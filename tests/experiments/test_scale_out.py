"""The scale-out experiment: the router model is blind to bids, keeps prefix groups together,
spills when a worker is overloaded; one worker is exactly the single-server experiment."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from inference_auctions.experiments.runner import Engine, measure
from inference_auctions.experiments.scale_out import (
    CACHE_THRESHOLD,
    ROUTERS,
    measure_deployment,
    route,
    run_scale_out,
)
from inference_auctions.experiments.scale_out_report import write_scale_out
from inference_auctions.experiments.workloads import Query, mixshare
from inference_auctions.server.cli import main

_QUEUE = mixshare(50, 96, np.random.default_rng(3))


@settings(max_examples=25, deadline=None)
@given(
    workers=st.integers(min_value=1, max_value=8),
    router=st.sampled_from(ROUTERS),
    seed=st.integers(min_value=0, max_value=2**32 - 1),
)
def test_routing_never_depends_on_bids(workers: int, router: str, seed: int) -> None:
    # Any other bids, same prompts: the same workers. A bid cannot move a request.
    rng = np.random.default_rng(seed)
    rebid = [replace(q, value=int(rng.integers(0, 10**9))) for q in _QUEUE.queries]
    assert route(rebid, workers, router) == route(_QUEUE.queries, workers, router)


def test_a_prefix_group_stays_on_one_worker_and_singletons_spread() -> None:
    rng = np.random.default_rng(0)
    prefix = rng.integers(1, 2**31, size=800)
    group = [
        Query(np.concatenate([prefix, rng.integers(1, 2**31, size=20)]), 1, 0, 8) for _ in range(6)
    ]
    alone = [Query(rng.integers(1, 2**31, size=800), 1, i + 1, 8) for i in range(6)]
    # Arrivals interleave the group with unrelated prompts.
    queries = [q for pair in zip(group, alone, strict=True) for q in pair]
    workers = route(queries, 4, "prefix-aware")
    assert len({workers[i] for i in range(0, 12, 2)}) == 1  # the whole group together
    assert len(set(workers)) == 4  # the rest to the least loaded
    assert route(queries, 4, "round-robin") == [i % 4 for i in range(12)]


def test_a_short_match_is_not_enough_and_an_overloaded_worker_spills() -> None:
    rng = np.random.default_rng(1)
    shared = rng.integers(1, 2**31, size=64)
    # 64 shared tokens of 800: below the threshold, so these are routed by load alone.
    weak = [
        Query(np.concatenate([shared, rng.integers(1, 2**31, size=736)]), 1, 0, 8) for _ in range(8)
    ]
    assert CACHE_THRESHOLD > 64 / 800
    assert sorted(route(weak, 2, "prefix-aware")) == [0, 0, 0, 0, 1, 1, 1, 1]
    # One huge group: cache affinity holds until its worker is well above the mean load, then
    # the group spills to the least loaded worker, which holds its prefix from then on.
    big = [Query(np.concatenate([shared, shared, shared, shared, [i]]), 1, 0, 8) for i in range(64)]
    loads = np.bincount(route(big, 4, "prefix-aware"), minlength=4)
    assert (loads > 0).sum() >= 2 and loads.max() < 32, loads


@pytest.mark.parametrize("order", ["dfs-bid", "bid-sort"])
def test_one_worker_is_the_single_server_experiment(order: str) -> None:
    engine = Engine()
    alone = measure(_QUEUE, order, 64, engine)
    deployed = measure_deployment(_QUEUE, 1, "prefix-aware", order, engine)
    assert deployed.welfare_percent == pytest.approx(alone.welfare_percent)
    assert deployed.mean_ttft == pytest.approx(alone.mean_ttft)
    assert deployed.hit_rate == pytest.approx(alone.hit_rate, abs=1e-9)
    assert deployed.busiest_share == 1.0


def test_a_small_run_writes_the_figure_the_numbers_and_the_table(tmp_path: Path) -> None:
    result = run_scale_out(queue=48, trials=1, seed=0, worker_counts=(1, 2))
    written = write_scale_out(result, tmp_path)
    assert sorted(p.name for p in written) == ["scale-out.json", "scale-out.md", "scale-out.png"]
    numbers = json.loads((tmp_path / "scale-out.json").read_text())
    points = numbers["points"]["prefix-aware"]["dfs-bid"]
    assert set(points) == {"1", "2"} and len(points["2"]) == 1
    assert numbers["points"]["round-robin"]["dfs-bid"]["1"] == points["1"]  # no routing at K=1
    table = (tmp_path / "scale-out.md").read_text()
    assert "| 2 | bid-sort | round-robin |" in table
    assert (tmp_path / "scale-out.png").read_bytes().startswith(b"\x89PNG")


def test_the_command_refuses_a_workload_file(tmp_path: Path) -> None:
    queue = tmp_path / "queue.jsonl"
    queue.write_text('{"tokens": [1, 2, 3], "value": 1}\n')
    result = CliRunner().invoke(main, ["experiment", "scale-out", "--workload", str(queue)])
    assert result.exit_code == 2
    assert "scale-out needs the synthetic workload" in result.output
