"""How long the auction core takes on one batch, next to SGLang's own ordering work.

For each batch size n the script builds the standard batch (about 1,000 tokens a prompt; half
the prompts in groups of 16 that share a 900-token article, the rest singletons; one user per
request; bids 1 + Pareto(1.5) credits; prompts as int32 arrays, as the server hands them over,
or as --tokens says) and times, best of --repeat runs:

* tree: validation and the radix tree build;
* schedule: the average-bid DFS;
* payments: the fast VCG payments;
* naive: VCG by re-solving the batch once per user with that user's bids zeroed (quadratic;
  only up to --naive-max);
* sglang: SGLang's RadixCache insert of every prompt plus its dfs-weight order, measured by
  bench/sglang_reference.py in SGLang's own virtualenv (see bench/setup_sglang_reference.sh)
  when --sglang-python points at it, on the very same prompts in the same run.

The "x n/4" column is the growth of the whole auction from the row of a quarter the size (the
default sizes grow 4x a row); n log n alone would give 4.8x from 1,024 to 4,096.

Run: `python -m bench.auction_speed` (add `--sglang-python /path/to/venv/bin/python`).
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import numpy as np
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from inference_auctions.server.auction import AuctionRequest
from inference_auctions.server.auction.batch import (
    RadixTree,
    TokenArray,
    build_radix_tree,
    validate_batch,
)
from inference_auctions.server.auction.charges import vcg_payment_numerators
from inference_auctions.server.auction.schedule import average_bid_dfs

ARTICLE_TOKENS = 900
QUESTION_TOKENS = 100
GROUP_SIZE = 16
VOCABULARY = 32_000
SGLANG_SCRIPT = Path(__file__).with_name("sglang_reference.py")
T = TypeVar("T")
TOKEN_FORMS = ("int32", "int64", "list")


def standard_batch(n: int, seed: int = 0, tokens: str = "int32") -> list[AuctionRequest]:
    """Half of the prompts in groups of 16 sharing a 900-token article, half singletons.

    `tokens` is the form the prompts take: an int32 or int64 array, or a list of ints.
    """
    rng = np.random.default_rng(seed)
    shared = n // 2
    prompts: list[TokenArray] = []
    for start in range(0, shared, GROUP_SIZE):
        article = rng.integers(1, VOCABULARY, ARTICLE_TOKENS)
        for _ in range(min(GROUP_SIZE, shared - start)):
            question = rng.integers(1, VOCABULARY, QUESTION_TOKENS)
            prompts.append(np.concatenate([article, question]))
    prompts.extend(
        rng.integers(1, VOCABULARY, ARTICLE_TOKENS + QUESTION_TOKENS) for _ in range(n - shared)
    )
    order = rng.permutation(n)  # arrivals interleave the groups and the singletons
    bids = ((1 + rng.pareto(1.5, n)) * 1_000_000).astype(np.int64)
    form: Callable[[TokenArray], TokenArray | list[int]] = {
        "int32": lambda prompt: prompt.astype(np.int32),
        "int64": lambda prompt: prompt.astype(np.int64),
        "list": lambda prompt: prompt.tolist(),
    }[tokens]
    return [
        AuctionRequest(rid=f"r{i}", user=f"u{i}", tokens=form(prompts[j]), bid=int(bids[i]))
        for i, j in enumerate(order)
    ]


def naive_payments(tree: RadixTree, bids: list[int], users: list[str]) -> dict[str, int]:
    """(n-1) * VCG payment per user by re-solving with each user's bids zeroed."""

    def phi(order: Sequence[int], values: Sequence[int]) -> int:
        n = len(order)
        return sum(values[r] * (n - 1 - k) for k, r in enumerate(order))

    chosen = average_bid_dfs(tree, bids).order
    result: dict[str, int] = {}
    for user in dict.fromkeys(users):
        without = [0 if u == user else b for u, b in zip(users, bids, strict=True)]
        result[user] = phi(average_bid_dfs(tree, without).order, without) - phi(chosen, without)
    return result


@dataclass
class Row:
    """One line of the table; times in seconds."""

    n: int
    tokens: int
    tree: float
    schedule: float
    payments: float
    naive: float | None
    sglang: float | None

    @property
    def total(self) -> float:
        """The whole auction, payments included."""
        return self.tree + self.schedule + self.payments


def _best(repeat: int, work: Callable[[], T]) -> tuple[float, T]:
    best, result = float("inf"), None
    for _ in range(repeat):
        started = time.perf_counter()
        result = work()
        best = min(best, time.perf_counter() - started)
    assert result is not None
    return best, result


def measure(
    n: int, repeat: int, naive_max: int, sglang_python: str | None, tokens: str = "int32"
) -> Row:
    """Time every stage of the auction on the standard batch of size n."""
    batch = standard_batch(n, tokens=tokens)
    tree_s, (valid, tree) = _best(
        repeat, lambda: (v := validate_batch(batch), build_radix_tree(v.prompts))
    )
    schedule_s, schedule = _best(repeat, lambda: average_bid_dfs(tree, valid.bids))
    payments_s, fast = _best(
        repeat, lambda: vcg_payment_numerators(tree, schedule, valid.bids, valid.users)
    )
    naive_s = None
    if n <= naive_max:
        naive_s, slow = _best(1, lambda: naive_payments(tree, valid.bids, valid.users))
        assert slow == fast, "fast and naive payments disagree"
    sglang_s = _sglang_seconds(sglang_python, valid.prompts, repeat) if sglang_python else None
    return Row(n, tree.stats.total_tokens, tree_s, schedule_s, payments_s, naive_s, sglang_s)


def _sglang_seconds(python: str, prompts: list[TokenArray], repeat: int) -> float:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "batch.npz"
        offsets = np.cumsum([0, *(p.size for p in prompts)]).astype(np.int64)
        np.savez(path, tokens=np.concatenate(prompts).astype(np.int64), offsets=offsets)
        command = [python, str(SGLANG_SCRIPT), "--input", str(path), "--repeat", str(repeat)]
        output = subprocess.run(command, check=True, capture_output=True, text=True).stdout
    report = json.loads(output.strip().splitlines()[-1])
    return float(report["total_s"])


def _growth(rows: list[Row], row: Row) -> float | None:
    """The whole auction's time at `row` over its time at a quarter of the size, if measured."""
    quarter = [other.total for other in rows if other.n * 4 == row.n]
    return row.total / quarter[0] if quarter else None


def _table(rows: list[Row]) -> Table:
    table = Table(title=f"Auction core on one batch ({platform.processor() or platform.machine()})")
    columns = ["n", "tokens", "tree s", "schedule s", "payments s", "auction s", "x n/4", "naive s"]
    for column in columns:
        table.add_column(column, justify="right")
    table.add_column("SGLang s", justify="right")
    table.add_column("auction / SGLang", justify="right")

    def seconds(value: float | None) -> str:
        return "-" if value is None else f"{value:.4f}"

    for row in rows:
        ratio = "-" if row.sglang is None else f"{row.total / row.sglang:.2f}"
        quarter = _growth(rows, row)
        table.add_row(
            f"{row.n:,}",
            f"{row.tokens:,}",
            *map(seconds, [row.tree, row.schedule, row.payments, row.total]),
            "-" if quarter is None else f"{quarter:.2f}",
            seconds(row.naive),
            seconds(row.sglang),
            ratio,
        )
    return table


def main(argv: Sequence[str] | None = None) -> None:
    """Run the benchmark and print its table."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", type=int, nargs="+", default=[256, 1024, 4096, 16384])
    parser.add_argument("--repeat", type=int, default=3, help="best of this many runs")
    parser.add_argument("--naive-max", type=int, default=2048, help="largest n for naive VCG")
    parser.add_argument("--sglang-python", help="python of a virtualenv with sglang installed")
    parser.add_argument(
        "--tokens", choices=TOKEN_FORMS, default="int32", help="the form the prompts are handed in"
    )
    parser.add_argument("--json", action="store_true", help="print rows as JSON lines too")
    args = parser.parse_args(argv)
    rows: list[Row] = []
    with Progress(transient=True) as progress:
        task = progress.add_task("benchmarking", total=len(args.sizes))
        for n in args.sizes:
            progress.update(task, description=f"n = {n:,}")
            rows.append(measure(n, args.repeat, args.naive_max, args.sglang_python, args.tokens))
            progress.advance(task)
    Console().print(_table(rows))
    if args.json:
        for row in rows:
            growth = _growth(rows, row)
            print(json.dumps({**row.__dict__, "total": row.total, "growth": growth}))


if __name__ == "__main__":
    main()
