"""What in-step prefix deferral adds to a batch on the serving path.

For the benchmark batch of `bench.auction_speed` (half of the prompts in groups of 16 sharing
a 900-token article, half singletons), it times, best of `--repeat`:

* `run_auction` on the batch: the reference, since the rule runs right after it;
* `BatchPrefixes.from_outcome` plus `PrefixDeferral.add_batch`: the work when the batch is
  dispatched (what is sent now, what is held);
* one `first_token` per request, in the auction's order, as the engine's first tokens come in
  (with the releases they cause): the work spread over the batch's life.

The rule's total per batch is reported against the auction's time and per request.

Run: `python -m bench.deferral_cost` (see --help).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from dataclasses import dataclass

from rich.console import Console
from rich.table import Table

from bench.auction_speed import standard_batch
from inference_auctions.server.auction import run_auction
from inference_auctions.server.serving.deferral import BatchPrefixes, PrefixDeferral


@dataclass(frozen=True, slots=True)
class Row:
    """Seconds per batch of each part, and how many requests the rule held back."""

    n: int
    auction: float
    dispatch: float
    first_tokens: float
    held: int

    @property
    def rule(self) -> float:
        """The rule's whole cost over the batch's life."""
        return self.dispatch + self.first_tokens


def measure(n: int, repeat: int) -> Row:
    """Best-of-`repeat` timings on the benchmark batch of `n` requests."""
    batch = standard_batch(n)
    auction = dispatch = first_tokens = float("inf")
    held = 0
    for _ in range(repeat):
        started = time.perf_counter()
        outcome = run_auction(batch)
        auction = min(auction, time.perf_counter() - started)

        started = time.perf_counter()
        rule: PrefixDeferral[str] = PrefixDeferral()
        sent = rule.add_batch(BatchPrefixes.from_outcome(outcome), outcome.order, now=0.0)
        dispatch = min(dispatch, time.perf_counter() - started)
        held = n - len(sent)

        started = time.perf_counter()
        for place, rid in enumerate(outcome.order):
            rule.first_token(rid, now=float(place))
        first_tokens = min(first_tokens, time.perf_counter() - started)
        assert rule.holding == 0
    return Row(n, auction, dispatch, first_tokens, held)


def _table(rows: list[Row]) -> Table:
    table = Table(title="In-step prefix deferral: cost per batch")
    for column in (
        "n",
        "held back",
        "auction s",
        "dispatch s",
        "first tokens s",
        "rule s",
        "rule / auction",
        "rule µs per request",
    ):
        table.add_column(column, justify="right")
    for row in rows:
        table.add_row(
            f"{row.n:,}",
            f"{row.held:,}",
            f"{row.auction:.4f}",
            f"{row.dispatch:.4f}",
            f"{row.first_tokens:.4f}",
            f"{row.rule:.4f}",
            f"{row.rule / row.auction:.2f}",
            f"{row.rule / row.n * 1e6:.1f}",
        )
    return table


def main(argv: Sequence[str] | None = None) -> None:
    """Print the table."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", type=int, nargs="+", default=[256, 1024, 4096])
    parser.add_argument("--repeat", type=int, default=5, help="best of this many runs")
    args = parser.parse_args(argv)
    Console(width=120).print(_table([measure(n, args.repeat) for n in args.sizes]))


if __name__ == "__main__":
    main()
