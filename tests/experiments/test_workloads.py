"""Workload shapes: token counts, sharing fractions, chain extension, 3-ary branching, values."""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Callable
from itertools import pairwise
from pathlib import Path

import numpy as np
import pytest

from inference_auctions.experiments.workloads import (
    OUTPUT_TOKENS,
    Query,
    Workload,
    WorkloadFileError,
    chains,
    draw_values,
    load_workload,
    mixshare,
    one_cluster_bids,
    trees,
)
from inference_auctions.server.auction.batch import build_radix_tree

QUEUE = 1024


def _rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def _groups(workload: Workload) -> dict[int, list[Query]]:
    groups: dict[int, list[Query]] = defaultdict(list)
    for query in workload.queries:
        groups[query.group].append(query)
    return groups


def _mean_tokens(workload: Workload) -> float:
    return float(np.mean([len(q.tokens) for q in workload.queries]))


def _common_prefix(members: list[Query]) -> int:
    shortest = min(len(q.tokens) for q in members)
    rows = np.stack([q.tokens[:shortest] for q in members])
    differs = np.flatnonzero((rows != rows[0]).any(axis=0))
    return int(differs[0]) if differs.size else shortest


def _is_prefix(short: Query, long: Query) -> bool:
    n = len(short.tokens)
    return n <= len(long.tokens) and bool(np.array_equal(short.tokens, long.tokens[:n]))


@pytest.mark.parametrize("share", [0, 25, 50, 100])
def test_mixshare_shares_a_prefix_in_p_percent_of_queries(share: int) -> None:
    workload = mixshare(share, QUEUE, _rng(share))
    assert len(workload) == QUEUE
    groups = _groups(workload)
    clustered = sum(len(members) for members in groups.values() if len(members) > 1)
    assert clustered == round(QUEUE * share / 100)
    assert 900 <= _mean_tokens(workload) <= 1100  # the paper's ~1k-token star prompts
    for members in groups.values():
        if len(members) > 1:
            # Members share an 800-1200-token article or few-shot prefix, then differ.
            assert 800 <= _common_prefix(members) <= 1200


def test_mixshare_clusters_are_article_and_few_shot_sized() -> None:
    sizes = sorted(len(m) for m in _groups(mixshare(50, QUEUE, _rng())).values() if len(m) > 1)
    assert len(sizes) == 16 + 4  # 256 article questions in 16s, 256 math ones in 64s
    assert np.mean(sizes) == pytest.approx(512 / 20)


def test_singletons_share_nothing() -> None:
    workload = mixshare(0, 300, _rng())
    stats = build_radix_tree([q.tokens for q in workload.queries]).stats
    assert stats.shared_tokens == 0


def test_each_chain_step_extends_the_previous_prompt() -> None:
    workload = chains(QUEUE, _rng())
    assert len(workload) == QUEUE
    assert 2700 <= _mean_tokens(workload) <= 3300  # ~3k tokens per prompt
    for members in _groups(workload).values():
        steps = sorted(members, key=lambda q: len(q.tokens))
        assert len(steps) <= 14
        for shorter, longer in pairwise(steps):
            assert _is_prefix(shorter, longer)
            assert 150 <= len(longer.tokens) - len(shorter.tokens) <= 450


@pytest.mark.parametrize(
    ("variant", "low", "high", "depth"), [("short", 140, 180, 5), ("long", 3800, 4700, 3)]
)
def test_trees_are_three_ary_and_sized_like_the_paper(
    variant: str, low: int, high: int, depth: int
) -> None:
    workload = trees(variant, QUEUE, _rng())
    assert low <= _mean_tokens(workload) <= high
    for members in _groups(workload).values():
        by_length = sorted(members, key=lambda q: len(q.tokens))
        root = by_length[0]
        children: dict[int, int] = defaultdict(int)
        for node in by_length[1:]:
            parents = [
                p for p in by_length if len(p.tokens) < len(node.tokens) and _is_prefix(p, node)
            ]
            assert root in parents
            # The longest proper prefix is the parent: one thought shorter, never deeper than D.
            children[id(max(parents, key=lambda p: len(p.tokens)))] += 1
            assert len(parents) <= depth
        complete = len(members) == sum(3**k for k in range(depth + 1))
        if complete:
            assert sorted(set(children.values())) == [3]
            assert len(children) == sum(3**k for k in range(depth))


def test_short_trees_fit_the_cache_and_long_ones_do_not() -> None:
    short = build_radix_tree([q.tokens for q in trees("short", QUEUE, _rng()).queries]).stats
    long = build_radix_tree([q.tokens for q in trees("long", QUEUE, _rng()).queries]).stats
    assert short.unique_tokens < 23_000 < long.unique_tokens
    assert short.shared_tokens / short.total_tokens > 0.6
    assert long.shared_tokens / long.total_tokens > 0.9


def test_values_follow_one_plus_pareto() -> None:
    values = np.array(draw_values(range(200_000), 0.0, _rng())) / 1e6
    assert values.min() >= 1.0
    for x in (1.5, 2.0, 4.0, 10.0):
        # The survival function of 1 + Lomax(1.5) is x^-1.5.
        assert np.mean(values > x) == pytest.approx(x**-1.5, abs=0.005)


def test_rho_correlates_values_within_groups() -> None:
    groups = [g for g in range(500) for _ in range(4)]
    assert len(set(draw_values(groups, 1.0, _rng())[:4])) == 1
    independent = np.log(np.array(draw_values(groups, 0.0, _rng())).reshape(500, 4))
    correlated = np.log(np.array(draw_values(groups, 0.6, _rng())).reshape(500, 4))
    assert abs(np.corrcoef(independent[:, 0], independent[:, 1])[0, 1]) < 0.15
    assert np.corrcoef(correlated[:, 0], correlated[:, 1])[0, 1] > 0.4
    with pytest.raises(ValueError, match="rho"):
        draw_values(groups, 1.5, _rng())


def test_one_cluster_is_alone_in_bidding() -> None:
    workload = one_cluster_bids(QUEUE, _rng(3))
    bidding = {q.group for q in workload.queries if q.value > 0}
    assert len(bidding) == 1
    (group,) = bidding
    assert len(_groups(workload)[group]) > 1
    assert all(q.value > 0 for q in _groups(workload)[group])


def test_arrival_interleaves_groups() -> None:
    groups = [q.group for q in mixshare(100, QUEUE, _rng()).queries]
    runs = sum(a != b for a, b in pairwise(groups))
    assert runs > QUEUE * 0.8  # shuffled, not cluster after cluster


@pytest.mark.parametrize(
    "make",
    [
        lambda rng, outputs: mixshare(50, QUEUE, rng, outputs=outputs),
        lambda rng, outputs: chains(QUEUE, rng, outputs=outputs),
        lambda rng, outputs: trees("short", QUEUE, rng, outputs=outputs),
        lambda rng, outputs: one_cluster_bids(QUEUE, rng, outputs=outputs),
    ],
)
def test_output_lengths_vary_over_their_range_and_move_nothing_else(
    make: Callable[[np.random.Generator, tuple[int, int]], Workload],
) -> None:
    rng = _rng(5)
    varied = make(rng, OUTPUT_TOKENS)
    after_varied = rng.integers(1 << 30)
    rng = _rng(5)
    fixed = make(rng, (64, 64))
    after_fixed = rng.integers(1 << 30)
    lengths = np.array([q.max_new_tokens for q in varied.queries])
    assert lengths.min() == OUTPUT_TOKENS[0] and lengths.max() == OUTPUT_TOKENS[1]
    assert abs(lengths.mean() - sum(OUTPUT_TOKENS) / 2) < 3  # uniform: mean 64 over 1,024
    assert {q.max_new_tokens for q in fixed.queries} == {64}
    # The same prompts, values and groups in the same order, and the generator left where
    # it was: changing the output range changes nothing else in this or later queues.
    for a, b in zip(varied.queries, fixed.queries, strict=True):
        assert np.array_equal(a.tokens, b.tokens) and (a.value, a.group) == (b.value, b.group)
    assert after_varied == after_fixed


@pytest.mark.parametrize("outputs", [(-1, 5), (9, 8)])
def test_an_empty_or_negative_output_range_is_refused(outputs: tuple[int, int]) -> None:
    with pytest.raises(ValueError, match="output tokens"):
        mixshare(50, 10, _rng(), outputs=outputs)


def test_a_workload_file_reads_prompts_tokens_and_values(tmp_path: Path) -> None:
    path = tmp_path / "mine.jsonl"
    lines = [
        {"prompt": "Read this article about owls. What do owls eat?", "value": "0.25"},
        {"prompt": "Read this article about owls. Where do owls sleep?", "value": 1.5},
        {"tokens": [5, 6, 7], "max_new_tokens": 8},
    ]
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n\n", encoding="utf-8")
    workload = load_workload(path, _rng())
    assert workload.name == "mine"
    first, second, third = workload.queries
    assert (first.value, second.value) == (250_000, 1_500_000)
    assert third.value >= 1_000_000  # drawn: 1 + Pareto(1.5) credits
    assert third.tokens.tolist() == [5, 6, 7] and third.max_new_tokens == 8
    # A line without max_new_tokens gets a draw from the output range.
    low, high = OUTPUT_TOKENS
    assert low <= first.max_new_tokens <= high and low <= second.max_new_tokens <= high
    assert np.array_equal(first.tokens[:6], second.tokens[:6])


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("not json", "not valid JSON"),
        ('{"value": 1}', "exactly one of"),
        ('{"tokens": [1, -2]}', "'tokens'"),
        ('{"prompt": "x", "value": "-1"}', "value"),
        ('{"prompt": "x", "max_new_tokens": -1}', "max_new_tokens"),
    ],
)
def test_a_bad_workload_line_names_its_line(tmp_path: Path, line: str, message: str) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"prompt": "fine"}\n' + line + "\n", encoding="utf-8")
    with pytest.raises(WorkloadFileError, match=rf"bad.jsonl:2: .*{message}"):
        load_workload(path, _rng())
