"""Regret and budget utilization of the SDK's pacing bidder under stationary competition.

The market, one auction per step: our user sends one request with value `v ~ min(1 +
Pareto(1.5), cap)` credits (numpy's Lomax plus one, as in the paper's experiments) into a batch
with `k` competing requests whose truthful bids are i.i.d. from the same law. All prompts are
distinct, so the radix tree is a star and every order is a DFS order: the auction ranks requests
by bid. A request that outranks `m` of the `k` competitors gets fractional priority `m / k`, and
its VCG payment is the externality it imposes, `sum of the outranked bids / k` (each of them
loses `1/k` of priority), rounded down to a micro-credit as the server does. With `k = 1` this is
a second-price auction.

The bidder is the SDK's own `PacingBidder` with `Budget(B, auctions=T)`. Regret is measured
against the best fixed multiplier in hindsight: `max_alpha U(alpha)` subject to the spend of
`alpha` over the same realized auctions staying within `B`, found exactly by sweeping the
multipliers at which the user starts to outrank each competitor.

Several processes of one user (`--processes P`): the auctions go to the processes in turn,
each process is a `PacingBidder` of the same plan, and every `--sync-every` auctions each one
takes the user's ledger-wide spend and auction count (`sync_shared`), as the clients do with
`GET /v1/spend`; `--restarts R` replaces every process with a fresh one (multiplier lost) R
times, evenly spread. Regret is the user's, over all auctions, against the same benchmark.

Run `python -m bench.pacing_regret` for the table and the fitted slope of log regret on log T.
"""

from __future__ import annotations

import argparse
import bisect
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from typing import Literal

import numpy as np
from numpy.typing import NDArray
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from inference_auctions.sdk import Budget, PacingBidder

MICROS = 1_000_000
DEFAULT_HORIZONS = (100, 200, 500, 1000, 2000, 5000, 10000)
# The plan's start as the shared sync reports it; the simulation has no wall clock.
_PLAN_START = datetime(2030, 1, 1, tzinfo=UTC)


@dataclass(frozen=True)
class Fleet:
    """How many processes of the user share the plan, how often they sync, how often they die."""

    processes: int = 1
    sync_every: int = 0
    """Auctions between ledger syncs (0: never; one process needs none)."""
    restarts: int = 0


@dataclass(frozen=True)
class Market:
    """The stationary environment: value law and the number of competing requests."""

    competitors: int = 7
    pareto_shape: float = 1.5
    value_cap: float = 10.0

    def draw(self, horizon: int, rng: np.random.Generator) -> tuple[list[int], list[list[int]]]:
        """Values and sorted competing bids in micro-credits for `horizon` auctions."""
        values = self._credits(rng, horizon)
        bids = np.sort(self._credits(rng, (horizon, self.competitors)), axis=1)
        return _micros(values).tolist(), _micros(bids).tolist()

    def spend_rate(self, rng: np.random.Generator, samples: int = 200_000) -> float:
        """Expected payment per auction in micro-credits when bidding full value."""
        values, bids = self.draw(samples, rng)
        total = 0
        for value, row in zip(values, bids, strict=True):
            total += _outcome(value, row, self.competitors)[1]
        return total / samples

    def _credits(
        self, rng: np.random.Generator, shape: int | tuple[int, int]
    ) -> NDArray[np.float64]:
        draws = 1.0 + rng.pareto(self.pareto_shape, size=shape)
        return np.minimum(draws, self.value_cap)


@dataclass(frozen=True)
class Run:
    """One simulated horizon: the bidder's results next to the best fixed multiplier's."""

    horizon: int
    budget: int
    utility: float
    spent: int
    alpha: float
    """The multiplier after the last auction."""
    mean_alpha: float
    """The multiplier averaged over the auctions."""
    best_utility: float
    best_alpha: float

    @property
    def regret(self) -> float:
        """Utility the best fixed multiplier would have had over the bidder's, in credits."""
        return (self.best_utility - self.utility) / MICROS

    @property
    def utilization(self) -> float:
        """Share of the budget spent."""
        return self.spent / self.budget


@dataclass(frozen=True)
class Row:
    """Mean results over seeds for one horizon."""

    horizon: int
    regret: float
    regret_se: float
    utilization: float
    alpha: float
    mean_alpha: float


def simulate(
    market: Market,
    horizon: int,
    gamma: float,
    seed: int,
    pacing: Literal["smooth", "asap"] = "smooth",
    fleet: Fleet = Fleet(),  # frozen: a shared default is safe
) -> Run:
    """Run the pacing bidder for `horizon` auctions with target spend `gamma` micros each."""
    rng = np.random.default_rng(seed)
    values, bids = market.draw(horizon, rng)
    budget_micros = int(gamma * horizon)
    budget = Budget(total=Decimal(budget_micros).scaleb(-6), auctions=horizon, pacing=pacing)
    bidders = [PacingBidder(budget) for _ in range(fleet.processes)]
    restarts = {horizon * (r + 1) // (fleet.restarts + 1) for r in range(fleet.restarts)}
    spent = 0
    utility = 0.0
    alpha_sum = 0.0
    for t, (value, row) in enumerate(zip(values, bids, strict=True)):
        if t in restarts:
            bidders = [PacingBidder(budget) for _ in range(fleet.processes)]
            _sync(bidders, spent, t)
        elif fleet.sync_every and t % fleet.sync_every == 0:
            _sync(bidders, spent, t)
        bidder = bidders[t % fleet.processes]
        alpha_sum += bidder.alpha
        (bid,) = bidder.bid([value])
        gain, payment = _outcome_of_bid(value, bid, row, market.competitors)
        bidder.settle(f"b{t}", payment, reserved=bid)
        spent += payment
        utility += gain
    best_utility, best_alpha = best_fixed_multiplier(values, bids, budget_micros)
    return Run(
        horizon=horizon,
        budget=budget_micros,
        utility=utility,
        spent=spent,
        alpha=bidder.alpha,
        mean_alpha=alpha_sum / horizon,
        best_utility=best_utility,
        best_alpha=best_alpha,
    )


def _sync(bidders: Sequence[PacingBidder], spent: int, auctions: int) -> None:
    """Every process takes the user's ledger-wide spend and auction count."""
    for bidder in bidders:
        bidder.sync_shared(
            marker=bidder.sync_marker(),
            spent_micros=spent,
            auctions=auctions,
            window=(_PLAN_START, None),
            now=_PLAN_START,
        )


def best_fixed_multiplier(
    values: Sequence[int], bids: Sequence[Sequence[int]], budget: int
) -> tuple[float, float]:
    """The best utility of one multiplier over all auctions within the budget, and it."""
    value = np.asarray(values, dtype=np.float64)[:, None]
    competing = np.asarray(bids, dtype=np.float64)
    k = competing.shape[1]
    # Bidding floor(alpha * v) outranks a competitor bid c exactly when alpha >= (c + 1) / v.
    thresholds = ((competing + 1.0) / value).ravel()
    order = np.argsort(thresholds, kind="stable")
    gains = np.cumsum(((value - competing) / k).ravel()[order])
    spend = np.cumsum((competing / k).ravel()[order])
    # Spend only grows with alpha, so the affordable multipliers are a prefix of the sweep.
    affordable = int(np.searchsorted(spend, budget, side="right"))
    if affordable == 0 or gains[:affordable].max() <= 0.0:
        return 0.0, 0.0
    best = int(np.argmax(gains[:affordable]))
    return float(gains[best]), float(thresholds[order][best])


def sweep(
    market: Market,
    horizons: Sequence[int],
    seeds: int,
    budget_share: float,
    on_run: Callable[[], None] | None = None,
    fleet: Fleet = Fleet(),  # frozen: a shared default is safe
) -> list[Row]:
    """Mean regret, utilization and final alpha per horizon over `seeds` runs each."""
    gamma = budget_share * market.spend_rate(np.random.default_rng(12345))
    rows = []
    for horizon in horizons:
        runs = []
        for seed in range(seeds):
            runs.append(simulate(market, horizon, gamma, seed=1000 * horizon + seed, fleet=fleet))
            if on_run is not None:
                on_run()
        regrets = np.array([r.regret for r in runs])
        rows.append(
            Row(
                horizon=horizon,
                regret=float(regrets.mean()),
                regret_se=float(regrets.std(ddof=1) / math.sqrt(seeds)) if seeds > 1 else 0.0,
                utilization=float(np.mean([r.utilization for r in runs])),
                alpha=float(np.mean([r.alpha for r in runs])),
                mean_alpha=float(np.mean([r.mean_alpha for r in runs])),
            )
        )
    return rows


def loglog_slope(rows: Sequence[Row]) -> float:
    """Least-squares slope of log(regret) on log(T); needs positive mean regrets."""
    horizons = np.log([r.horizon for r in rows])
    regrets = np.log([max(r.regret, 1e-9) for r in rows])
    slope, _ = np.polyfit(horizons, regrets, 1)
    return float(slope)


def _outcome_of_bid(value: int, bid: int, bids: list[int], k: int) -> tuple[float, int]:
    """(utility in micros, payment in micros) of one bid against sorted competing bids."""
    outranked = bisect.bisect_left(bids, bid)
    paid = sum(bids[:outranked])
    return (value * outranked - paid) / k, paid // k


def _outcome(value: int, bids: list[int], k: int) -> tuple[float, int]:
    return _outcome_of_bid(value, value, bids, k)


def _micros(credits: NDArray[np.float64]) -> NDArray[np.int64]:
    return np.round(credits * MICROS).astype(np.int64)


def main(argv: Sequence[str] | None = None) -> None:
    """Print regret and utilization per horizon, and the log-log slope of regret."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--budget-share", type=float, default=0.5)
    parser.add_argument("--horizons", type=int, nargs="+", default=list(DEFAULT_HORIZONS))
    parser.add_argument("--processes", type=int, default=1)
    parser.add_argument("--sync-every", type=int, default=0)
    parser.add_argument("--restarts", type=int, default=0)
    args = parser.parse_args(argv)
    fleet = Fleet(args.processes, args.sync_every, args.restarts)
    market = Market()
    console = Console()
    horizons: list[int] = args.horizons
    with Progress(console=console, transient=True) as progress:
        binding_task = progress.add_task("budget binds", total=len(horizons) * args.seeds)
        binding = sweep(
            market,
            horizons,
            args.seeds,
            args.budget_share,
            lambda: progress.advance(binding_task),
            fleet,
        )
        loose_task = progress.add_task("budget loose", total=len(horizons) * args.seeds)
        loose = sweep(
            market, horizons, args.seeds, 4.0, lambda: progress.advance(loose_task), fleet
        )
    title = f"Pacing bidder, {args.seeds} seeds per row (means)"
    if fleet.processes > 1 or fleet.restarts:
        title += (
            f"; {fleet.processes} processes, sync every {fleet.sync_every} auctions,"
            f" {fleet.restarts} restarts"
        )
    table = Table(title=title)
    columns = ("T", "regret (credits)", "± s.e.", "regret/√T", "spent/B", "mean α", "α loose")
    for column in columns:
        table.add_column(column, justify="right")
    for row, free in zip(binding, loose, strict=True):
        table.add_row(
            str(row.horizon),
            f"{row.regret:.3f}",
            f"{row.regret_se:.3f}",
            f"{row.regret / math.sqrt(row.horizon):.4f}",
            f"{row.utilization:.4f}",
            f"{row.mean_alpha:.3f}",
            f"{free.alpha:.4f}",
        )
    console.print(table)
    console.print(f"log-log slope of regret on T (budget binds): {loglog_slope(binding):.3f}")
    console.print(f"utilization when the budget is loose: {loose[-1].utilization:.3f}")


if __name__ == "__main__":
    main()
