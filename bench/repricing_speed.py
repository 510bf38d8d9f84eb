"""How long clearing one batch takes with its per-request shares, re-solved against repriced.

Clearing a batch (server/serving/clearing.py) runs the auction and then splits every user's charge
over the user's requests (SPEC section 1, "One request's share"), which needs the user's charge with
each request's bid zeroed. For each batch size n the script takes the standard batch of
bench/auction_speed.py with its requests spread over --users users (request i to user i mod
--users) and times, in CPU time of this process, best of --repeat runs:

* auction: `run_auction` alone;
* shares before: every user's shares from `ResolvingRepricer`, the old way: the tree built
  again and the batch re-solved (schedule and payment) once per request of every user with
  several;
* shares after: every user's shares from `Repricer.from_outcome`, which reprices each request
  from the schedule the auction chose;
* clear before / after: auction plus shares, the whole of clearing's pricing.

Both give the same shares (checked on every row); the speed-up is clear before over clear after.
Run: `python -m bench.repricing_speed`.
"""

from __future__ import annotations

import argparse
import gc
import platform
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from rich.console import Console
from rich.table import Table

from bench.auction_speed import standard_batch
from inference_auctions.server.auction import AuctionOutcome, AuctionRequest, run_auction
from inference_auctions.server.auction.charges import Repricer
from inference_auctions.server.auction.reference import ResolvingRepricer

Shares = dict[str, int]


@dataclass
class Row:
    """One line of the table; CPU times in seconds."""

    n: int
    users: int
    auction: float
    shares_before: float
    shares_after: float

    @property
    def before(self) -> float:
        """Clearing with re-solved shares."""
        return self.auction + self.shares_before

    @property
    def after(self) -> float:
        """Clearing with repriced shares."""
        return self.auction + self.shares_after


def batch_of(n: int, users: int) -> list[AuctionRequest]:
    """The standard batch of size n, its requests spread round-robin over `users` users."""
    return [
        AuctionRequest(r.rid, f"u{i % users}", r.tokens, r.bid)
        for i, r in enumerate(standard_batch(n))
    ]


def shares_before(batch: Sequence[AuctionRequest], outcome: AuctionOutcome) -> Shares:
    """The shares as clearing priced them before: tree built again, a re-solve per request."""
    return _all_shares(outcome, ResolvingRepricer(batch).shares)


def shares_after(outcome: AuctionOutcome) -> Shares:
    """The shares as clearing prices them now: from the outcome's tree, schedule and payments."""
    return _all_shares(outcome, Repricer.from_outcome(outcome).shares)


def _all_shares(
    outcome: AuctionOutcome, shares: Callable[[str, int, dict[str, int]], Shares]
) -> Shares:
    result: Shares = {}
    for user, charge in outcome.payments.items():
        result.update(shares(user, charge, outcome.positions))
    return result


def _best_cpu(repeat: int, work: Callable[[], object]) -> float:
    best = float("inf")
    for _ in range(repeat):
        gc.collect()  # no collection of an earlier run's garbage inside this one
        started = time.process_time()
        work()
        best = min(best, time.process_time() - started)
    return best


def measure(n: int, users: int, repeat: int) -> Row:
    """Time the three ways on the batch of size n."""
    batch = batch_of(n, users)
    outcome = run_auction(batch)
    assert shares_before(batch, outcome) == shares_after(outcome), "repriced != re-solved"
    return Row(
        n=n,
        users=users,
        auction=_best_cpu(repeat, lambda: run_auction(batch)),
        shares_before=_best_cpu(repeat, lambda: shares_before(batch, outcome)),
        shares_after=_best_cpu(repeat, lambda: shares_after(outcome)),
    )


def _table(rows: list[Row], repeat: int) -> Table:
    title = (
        f"Clearing one batch with every request's share, CPU ms, best of {repeat} "
        f"({platform.processor() or platform.machine()})"
    )
    table = Table(title=title)
    columns = ["n", "users", "auction", "shares before", "shares after"]
    for column in [*columns, "clear before", "clear after", "speed-up"]:
        table.add_column(column, justify="right")
    for row in rows:
        table.add_row(
            f"{row.n:,}",
            str(row.users),
            *(
                f"{1000 * value:.2f}"
                for value in [
                    row.auction,
                    row.shares_before,
                    row.shares_after,
                    row.before,
                    row.after,
                ]
            ),
            f"{row.before / row.after:.1f}x",
        )
    return table


def main(argv: Sequence[str] | None = None) -> None:
    """Run the benchmark and print its table."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", type=int, nargs="+", default=[64, 256, 1024])
    parser.add_argument("--users", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=5, help="best of this many runs")
    args = parser.parse_args(argv)
    rows = [measure(n, args.users, args.repeat) for n in args.sizes]
    Console(width=110).print(_table(rows, args.repeat))


if __name__ == "__main__":
    main()
