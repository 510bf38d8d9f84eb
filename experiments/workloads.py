"""The queues the experiments serve: the paper's prefix shapes and token counts, or a user's file.

Only token counts and prefix structure matter to the auction and the cache, so the synthetic
workloads draw random token ids with the sizes of the paper's sources (Section 5):

* stars, `mixshare-P`: P% of the queries share a prefix, half of them one of several ~1k-token
  articles (SQuAD-like: a short question after the article, 16 questions an article on
  average) and half one of a few ~900-token few-shot prompts (GSM8K-like: a grade-school
  question after eight worked examples, 64 queries a prompt on average); the rest are
  singletons, an article nobody else asks about plus its question.
* chains (SWE-agent-like trajectories): a ~1.6k-token task prompt, then each step appends an
  action and its observation (~300 tokens), so every prompt extends the previous one; 6-14
  steps, ~3k tokens a prompt on average.
* 3-ary trees (tree-of-thought): every node is a query whose prompt is its parent's plus one
  thought. Short: a ~100-token problem and ~13-token thoughts, depth 5 (~160 tokens a prompt,
  the whole queue fits in a 23k-token cache). Long: a 3-5k-token article and ~100-token
  thoughts, depth 3 (~4.3k tokens a prompt, far beyond the cache).

Every query asks for its own number of output tokens, drawn uniformly from `OUTPUT_TOKENS` (8 to
120, mean 64): answers, thoughts and agent actions vary in length, and equal lengths would make
the running requests finish together and the engine admit new ones in synchronized waves.

Queries arrive in a random order (a saturated queue interleaves its users). Values are
`1 + Pareto(1.5)` credits; within a group (a cluster, chain or tree) they are correlated by
`rho` through a Gaussian copula, which keeps every value's law exactly 1 + numpy's Lomax(1.5)
and gives members of a group equal values at `rho = 1`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from inference_auctions.billing.money import MICROS_PER_CREDIT
from inference_auctions.server.cli.jsonlines import (
    RecordError,
    read_records,
    record_credits,
    record_tokens,
)

__all__ = [
    "OUTPUT_TOKENS",
    "TREE_SHAPES",
    "Query",
    "TreeShape",
    "Workload",
    "WorkloadFileError",
    "chains",
    "check_output_tokens",
    "draw_values",
    "load_workload",
    "mixshare",
    "one_cluster_bids",
    "trees",
]

PARETO_SHAPE = 1.5
# The paper does not state output lengths. Ours average 64 tokens, a short answer or one
# thought, for every workload; they set how long decoding holds memory. The spread follows
# SGLang's own bench_serving (uniform over a range): real outputs stop at different lengths.
OUTPUT_TOKENS = (8, 120)
# Random token ids from a large range: distinct segments share a first token with negligible
# probability, so the radix tree has exactly the intended shape.
_TOKEN_RANGE = (1, 2**31 - 1)

# Token counts, drawn uniformly from these inclusive ranges.
ARTICLE_TOKENS = (800, 1200)
QUESTION_TOKENS = (10, 30)
FEW_SHOT_TOKENS = (800, 1000)
MATH_QUESTION_TOKENS = (40, 100)
ARTICLE_CLUSTER_SIZE = 16
FEW_SHOT_CLUSTER_SIZE = 64
TASK_TOKENS = (1200, 2000)
STEP_TOKENS = (150, 450)
CHAIN_STEPS = (6, 14)
BRANCHING = 3


@dataclass(frozen=True, slots=True)
class TreeShape:
    """Token counts of a tree-of-thought variant: its root prompt, each thought, its depth."""

    root: tuple[int, int]
    thought: tuple[int, int]
    depth: int


TREE_SHAPES = {
    "short": TreeShape(root=(80, 120), thought=(8, 18), depth=5),
    "long": TreeShape(root=(3000, 5000), thought=(60, 140), depth=3),
}


Tokens = npt.NDArray[np.int64]


@dataclass(frozen=True, slots=True, eq=False)
class Query:
    """One queued request: its prompt, its value (micro-credits) and its prefix group."""

    tokens: Tokens
    value: int
    group: int
    max_new_tokens: int


@dataclass(frozen=True, slots=True)
class Workload:
    """A queue of queries in arrival order."""

    name: str
    queries: tuple[Query, ...]

    def __len__(self) -> int:
        return len(self.queries)

    @property
    def values(self) -> list[int]:
        """Every query's value, in arrival order."""
        return [query.value for query in self.queries]


class WorkloadFileError(ValueError):
    """A line of a workload file is malformed; the message names the line and the field."""


class _Builder:
    """Collects (prompt, group) pairs, then shuffles them and attaches values."""

    def __init__(self, rng: np.random.Generator) -> None:
        self.rng = rng
        self.prompts: list[Tokens] = []
        self.groups: list[int] = []
        self._next_group = 0

    def segment(self, size_range: tuple[int, int]) -> Tokens:
        size = int(self.rng.integers(size_range[0], size_range[1] + 1))
        return self.rng.integers(*_TOKEN_RANGE, size=size, dtype=np.int64)

    def new_group(self) -> int:
        self._next_group += 1
        return self._next_group - 1

    def add(self, prompt: Tokens, group: int) -> None:
        self.prompts.append(prompt)
        self.groups.append(group)

    def build(self, name: str, rho: float, outputs: tuple[int, int]) -> Workload:
        arrival = self.rng.permutation(len(self.prompts))
        groups = [self.groups[i] for i in arrival]
        values = draw_values(groups, rho, self.rng)
        lengths = draw_output_tokens(len(arrival), outputs, self.rng)
        queries = tuple(
            Query(self.prompts[i], value, group, length)
            for i, value, group, length in zip(arrival, values, groups, lengths, strict=True)
        )
        return Workload(name, queries)


def check_output_tokens(outputs: tuple[int, int]) -> None:
    """Refuse an output-length range that is empty or negative."""
    low, high = outputs
    if not 0 <= low <= high:
        raise ValueError(f"output tokens must be a range 0 <= low <= high, got {low}-{high}")


def draw_output_tokens(count: int, outputs: tuple[int, int], rng: np.random.Generator) -> list[int]:
    """`count` output lengths, uniform over the inclusive range `outputs`.

    They come from a child of `rng`, which leaves `rng`'s own stream untouched: the prompts and
    values of a queue, and every queue drawn after it, do not depend on the output range.
    """
    check_output_tokens(outputs)
    (child,) = rng.spawn(1)
    return [int(n) for n in child.integers(outputs[0], outputs[1] + 1, size=count).tolist()]


def draw_values(groups: Sequence[int], rho: float, rng: np.random.Generator) -> list[int]:
    """Values in micro-credits, each `1 + Pareto(1.5)`, correlated by `rho` within a group."""
    if not 0.0 <= rho <= 1.0:
        raise ValueError(f"rho must be in [0, 1], got {rho}")
    labels, index = np.unique(np.asarray(groups, dtype=np.int64), return_inverse=True)
    shared = rng.standard_normal(len(labels))[index]
    own = rng.standard_normal(len(groups))
    z = math.sqrt(rho) * shared + math.sqrt(1.0 - rho) * own
    # The survival function of the standard normal, computed directly so that the far tail,
    # where the Pareto values are large, keeps its precision.
    survival = np.array([0.5 * math.erfc(x / math.sqrt(2.0)) for x in z.tolist()])
    survival = np.maximum(survival, np.finfo(np.float64).tiny)
    credits = survival ** (-1.0 / PARETO_SHAPE)
    return [int(c) for c in np.floor(credits * MICROS_PER_CREDIT).tolist()]


def mixshare(
    share: float,
    queue: int,
    rng: np.random.Generator,
    *,
    rho: float = 0.0,
    outputs: tuple[int, int] = OUTPUT_TOKENS,
) -> Workload:
    """Stars: `share` percent of the queries in article or few-shot clusters, the rest alone."""
    if not 0.0 <= share <= 100.0:
        raise ValueError(f"share must be a percentage in [0, 100], got {share}")
    builder = _Builder(rng)
    shared = round(queue * share / 100.0)
    articles = shared // 2
    for members, cluster_size, prefix, suffix in (
        (articles, ARTICLE_CLUSTER_SIZE, ARTICLE_TOKENS, QUESTION_TOKENS),
        (shared - articles, FEW_SHOT_CLUSTER_SIZE, FEW_SHOT_TOKENS, MATH_QUESTION_TOKENS),
    ):
        _add_clusters(builder, members, cluster_size, prefix, suffix)
    for _ in range(queue - shared):
        builder.add(
            np.concatenate([builder.segment(ARTICLE_TOKENS), builder.segment(QUESTION_TOKENS)]),
            builder.new_group(),
        )
    return builder.build(f"mixshare-{share:g}", rho, outputs)


def _add_clusters(
    builder: _Builder,
    members: int,
    mean_size: int,
    prefix_tokens: tuple[int, int],
    suffix_tokens: tuple[int, int],
) -> None:
    """`members` queries spread at random over clusters of `mean_size` on average."""
    if members == 0:
        return
    clusters = max(1, round(members / mean_size))
    # Every cluster gets one member, the rest land uniformly: sizes vary as real data does.
    owner = np.concatenate(
        [np.arange(clusters), builder.rng.integers(0, clusters, members - clusters)]
    )
    prefixes = [builder.segment(prefix_tokens) for _ in range(clusters)]
    groups = [builder.new_group() for _ in range(clusters)]
    for cluster in owner.tolist():
        builder.add(
            np.concatenate([prefixes[cluster], builder.segment(suffix_tokens)]), groups[cluster]
        )


def chains(
    queue: int,
    rng: np.random.Generator,
    *,
    rho: float = 0.0,
    outputs: tuple[int, int] = OUTPUT_TOKENS,
) -> Workload:
    """Agent trajectories: each step's prompt extends the previous step's prompt."""
    builder = _Builder(rng)
    while len(builder.prompts) < queue:
        group = builder.new_group()
        prompt = builder.segment(TASK_TOKENS)
        steps = int(rng.integers(CHAIN_STEPS[0], CHAIN_STEPS[1] + 1))
        for step in range(min(steps, queue - len(builder.prompts))):
            if step:
                prompt = np.concatenate([prompt, builder.segment(STEP_TOKENS)])
            builder.add(prompt, group)
    return builder.build("chains", rho, outputs)


def trees(
    variant: str,
    queue: int,
    rng: np.random.Generator,
    *,
    rho: float = 0.0,
    outputs: tuple[int, int] = OUTPUT_TOKENS,
) -> Workload:
    """3-ary tree-of-thought trees, `variant` "short" (fits the cache) or "long"."""
    if variant not in TREE_SHAPES:
        raise ValueError(f"variant must be 'short' or 'long', got {variant!r}")
    shape = TREE_SHAPES[variant]
    builder = _Builder(rng)
    while len(builder.prompts) < queue:
        group = builder.new_group()
        # Breadth first, so a tree cut short by the queue's end keeps its upper levels.
        level = [builder.segment(shape.root)]
        for level_depth in range(shape.depth + 1):
            for prompt in level:
                if len(builder.prompts) < queue:
                    builder.add(prompt, group)
            if level_depth < shape.depth:
                level = [
                    np.concatenate([p, builder.segment(shape.thought)])
                    for p in level
                    for _ in range(BRANCHING)
                ]
    return builder.build(f"trees-{variant}", rho, outputs)


def one_cluster_bids(
    queue: int, rng: np.random.Generator, *, outputs: tuple[int, int] = OUTPUT_TOKENS
) -> Workload:
    """mixshare-50 where one shared-prefix cluster, chosen at random, is alone in bidding."""
    base = mixshare(50.0, queue, rng, outputs=outputs)
    sizes: dict[int, int] = {}
    for query in base.queries:
        sizes[query.group] = sizes.get(query.group, 0) + 1
    clusters = sorted(group for group, size in sizes.items() if size > 1)
    chosen = clusters[int(rng.integers(len(clusters)))]
    queries = tuple(
        query if query.group == chosen else replace(query, value=0) for query in base.queries
    )
    return Workload("one-cluster-bids", queries)


def load_workload(
    path: Path, rng: np.random.Generator, *, outputs: tuple[int, int] = OUTPUT_TOKENS
) -> Workload:
    """Read a JSON-lines workload; what a line leaves out is drawn as for the synthetic ones.

    Each line holds `prompt` (text, tokenized offline) or `tokens` (ids), and optionally
    `value` (credits, a number or a decimal string; else a `1 + Pareto(1.5)` draw) and
    `max_new_tokens` (else a draw from `outputs`). The lines are the queue in arrival order.
    """
    with path.open(encoding="utf-8") as lines:
        records = list(_records(lines, path.name))
    if not records:
        raise WorkloadFileError(f"{path.name}: no queries")
    drawn = draw_values(range(len(records)), 0.0, rng)
    lengths = draw_output_tokens(len(records), outputs, rng)
    queries = tuple(
        Query(
            tokens,
            drawn[i] if value is None else value,
            i,
            lengths[i] if max_new is None else max_new,
        )
        for i, (tokens, value, max_new) in enumerate(records)
    )
    return Workload(path.stem, queries)


def _records(lines: Iterable[str], name: str) -> Iterable[tuple[Tokens, int | None, int | None]]:
    try:
        for where, record in read_records(lines, name):
            tokens = record_tokens(record, where)
            if not tokens:
                raise RecordError(f"{where}: the prompt is empty")
            value = record_credits(record, "value", where)
            yield np.asarray(tokens, dtype=np.int64), value, _max_new(record, where)
    except RecordError as error:
        raise WorkloadFileError(str(error)) from None


def _max_new(record: dict[str, Any], where: str) -> int | None:
    value = record.get("max_new_tokens")
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise RecordError(f"{where}: field 'max_new_tokens' must be an int >= 0")
    return value
