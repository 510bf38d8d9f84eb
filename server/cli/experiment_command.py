"""`inference-auction experiment`: reproduce the paper's figures on the emulated engine.

The experiments live in the `inference_auctions.experiments` package, imported only when the
command runs so that every other command starts without numpy, matplotlib and the simulator.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from inference_auctions.server.emulator.simulator import DEFAULT_CACHE_TOKENS
from inference_auctions.server.serving.deferral import (
    DEFAULT_MAX_HOLD_SECONDS,
    DEFAULT_THRESHOLD_TOKENS,
    DeferralSettings,
)

TARGETS = (
    "figure1",
    "figure2",
    "figure3",
    "figure4",
    "all",
    "scale-out",
    "manipulation",
    "live",
)
# Figures 3 and 4 need the generators' cluster and user structure; a file has neither.
FILE_FIGURES = ("figure1", "figure2")


def _output_range(_ctx: click.Context, _param: click.Parameter, text: str) -> tuple[int, int]:
    """Parse "LOW-HIGH" or "N" (every query N tokens) into an inclusive range."""
    match = re.fullmatch(r"(\d+)(?:-(\d+))?", text.strip())
    if match is None:
        raise click.BadParameter(
            f"{text!r} is not LOW-HIGH or N, e.g. 8-120 or 64", param_hint="--output-tokens"
        )
    low = int(match[1])
    high = int(match[2]) if match[2] is not None else low
    if low > high:
        raise click.BadParameter(f"{text!r}: LOW is above HIGH", param_hint="--output-tokens")
    if high > DEFAULT_CACHE_TOKENS:
        raise click.BadParameter(
            f"{text!r}: an output cannot exceed the {DEFAULT_CACHE_TOKENS:,}-token KV cache",
            param_hint="--output-tokens",
        )
    return low, high


class _RichTracker:
    """Progress bars: one per sweep, ticking once per point and trial."""

    def __init__(self, progress: Progress) -> None:
        self._progress = progress

    def start(self, description: str, total: int) -> Callable[[], None]:
        task = self._progress.add_task(description, total=total)
        return lambda: self._progress.advance(task)


@click.command()
@click.argument("target", type=click.Choice(TARGETS))
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("results"),
    show_default=True,
    help="Directory for the PNG plots, results.json and results.md.",
)
@click.option(
    "--quick", is_flag=True, help="Q = 512, a coarser grid and T = 20 auctions: under a minute."
)
@click.option("--trials", type=click.IntRange(min=1), default=3, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of every random draw.")
@click.option(
    "--workload",
    "workload_file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="Your own queue as JSON lines (see below) in place of the synthetic workloads.",
)
@click.option(
    "--orders",
    default="dfs-bid,dfs-uniform,bid-sort,no-sort",
    show_default=True,
    help="Comma-separated orders to compare.",
)
@click.option(
    "--output-tokens",
    "output_tokens",
    default="8-120",
    show_default=True,
    callback=_output_range,
    metavar="LOW-HIGH",
    help="Each query's output length, drawn uniformly from this range (N: all N tokens). "
    "A workload file's max_new_tokens wins over it.",
)
@click.option(
    "--deferral/--no-deferral",
    default=True,
    show_default=True,
    help="Apply the server's in-step prefix deferral rule to the auction's orders.",
)
@click.option(
    "--deferral-tokens",
    type=click.IntRange(min=1),
    default=DEFAULT_THRESHOLD_TOKENS,
    show_default=True,
    help="Shared uncached prompt tokens that make a query wait (the server's setting).",
)
@click.option(
    "--deferral-max-hold",
    type=click.FloatRange(min=0),
    default=DEFAULT_MAX_HOLD_SECONDS,
    show_default=True,
    help="The longest a query is held back, in simulated seconds.",
)
@click.option(
    "--engine-url",
    help="live only: a real SGLang server (priority scheduling on, low values first, a small "
    "--max-running-requests) instead of the embedded emulator; its capacity is measured.",
)
@click.option(
    "--load",
    type=click.FloatRange(min=0.1, max=10),
    default=1.5,
    show_default=True,
    help="live only: arrivals as a multiple of the engine's measured capacity.",
)
@click.option(
    "--timing",
    is_flag=True,
    help="manipulation only: the study of timing under the rolling auction instead "
    '(timing.md and timing.png in --out; docs/RESULTS.md, "Timing").',
)
@click.option(
    "--schemes",
    default="fcfs,tiers2,tiers3,auction",
    show_default=True,
    help="live only: the comma-separated schemes to run, on the same plan (also "
    "auction-no-floor: the auction under --price-floor off).",
)
def experiment(
    target: str,
    out: Path,
    quick: bool,
    trials: int,
    seed: int,
    workload_file: Path | None,
    orders: str,
    output_tokens: tuple[int, int],
    deferral: bool,
    deferral_tokens: int,
    deferral_max_hold: float,
    engine_url: str | None,
    load: float,
    timing: bool,
    schemes: str,
) -> None:
    """Reproduce the paper's experiments on the emulated SGLang engine (simulated clock).

    TARGET is figure1 (stars: batch size, sharing fraction, value correlation), figure2 (tree
    topologies), figure3 (one cluster bids), figure4 (pacing autobidders) or all. Each figure
    is written as a PNG, and every number goes to results.json and results.md in --out.
    scale-out runs K = 1, 2, 4, 8 workers, an auction each, behind a prefix-aware or a
    round-robin router (scale-out.png, .json and .md in --out; docs/SCALE-OUT.md).
    manipulation runs the study of junk requests, decoys, split and merged accounts and joint
    shading on both pricing rules (manipulation.md in --out; docs/RESULTS.md, "Manipulation");
    with --timing, what timing gains under the rolling auction's rules in a slot model of the
    live plan (--quick: one seed, 10 targets; timing.md and timing.png in --out;
    docs/RESULTS.md, "Timing").
    live runs the market through the real server four times on the same tenants, arrivals
    and values: fcfs, tiers2, tiers3 and auction (--quick: 10 s of traffic each, under two
    minutes in all; else 60 s); results.json, live.md and live.png in --out
    (docs/RESULTS.md, "The market, live").

    With --workload FILE, figure1 sweeps the batch size over your queue and figure2 compares
    the orders on it whole. FILE has one query per line, in arrival order:

    \b
      {"prompt": "Summarize ...", "value": "0.25"}
      {"tokens": [101, 7, 42], "value": 1.5, "max_new_tokens": 32}

    `value` (credits) is the truthful bid; without it a value is drawn from 1 + Pareto(1.5).
    Without `max_new_tokens` the output length is drawn from --output-tokens. Text prompts go
    through the default offline tokenizer.
    """
    # Imported here, not at the top: the rest of the CLI should not wait for numpy and matplotlib.
    from inference_auctions.experiments.orders import ORDERS  # noqa: PLC0415
    from inference_auctions.experiments.plan import FULL, QUICK  # noqa: PLC0415
    from inference_auctions.experiments.suite import FIGURES, Config, run  # noqa: PLC0415

    chosen = tuple(name.strip() for name in orders.split(",") if name.strip())
    unknown = [name for name in chosen if name not in ORDERS]
    if unknown or not chosen:
        raise click.BadParameter(f"choose from {', '.join(ORDERS)}", param_hint="--orders")
    if timing and target != "manipulation":
        raise click.UsageError("--timing is for the manipulation target only")
    if target == "live":
        if workload_file is not None:
            raise click.UsageError("live draws its own tenants and requests; drop --workload")
        _run_live(out, quick, seed, engine_url, load, _live_schemes(schemes))
        return
    if engine_url is not None:
        raise click.UsageError("--engine-url is for the live target only")
    if target == "manipulation":
        _run_manipulation(out, quick, seed, timing=timing, given_workload=workload_file)
        return
    if target == "scale-out":
        if workload_file is not None:
            raise click.UsageError("scale-out needs the synthetic workload; drop --workload")
        from inference_auctions.server.cli.scale_out_command import run_scale_out_target  # noqa: PLC0415

        given = click.get_current_context().get_parameter_source("orders")
        default = given is click.core.ParameterSource.DEFAULT
        run_scale_out_target(out, quick, trials, seed, None if default else chosen, output_tokens)
        return
    figures: tuple[str, ...] = FIGURES if target == "all" else (target,)
    if workload_file is not None:
        if target != "all" and target not in FILE_FIGURES:
            raise click.UsageError(
                f"{target} needs the synthetic workloads; use figure1 or figure2"
            )
        figures = tuple(f for f in figures if f in FILE_FIGURES)
    config = Config(
        figures=figures,
        out=out,
        scale=QUICK if quick else FULL,
        trials=trials,
        seed=seed,
        orders=chosen,
        workload_file=workload_file,
        output_tokens=output_tokens,
        deferral=DeferralSettings(deferral_tokens, deferral_max_hold) if deferral else None,
    )
    console = Console(stderr=True)
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=console) as progress:
        results = run(config, _RichTracker(progress))
    table = Table(title="Headline numbers: paper vs this run")
    for column in ("figure", "claim", "paper", "ours"):
        table.add_column(column, overflow="fold")
    for headline in results.headlines():
        table.add_row(headline.figure, headline.claim, headline.paper, headline.ours)
    console.print(table)
    written = sorted(path.name for path in out.iterdir() if path.suffix in (".png", ".json", ".md"))
    console.print(f"Wrote {', '.join(written)} to {out} in {sum(results.elapsed.values()):.0f} s.")


def _run_manipulation(
    out: Path, quick: bool, seed: int, *, timing: bool, given_workload: Path | None
) -> None:
    """The manipulation study: 120 small instances and the paper-scale decoys (--quick: 12
    instances, no paper scale), its tables printed and written to manipulation.md; with
    `timing`, the study of timing (`_run_timing`) instead."""
    if given_workload is not None:
        raise click.UsageError("manipulation draws its own batches; drop --workload")
    if timing:
        _run_timing(out, quick, seed)
        return
    from inference_auctions.experiments import manipulation  # noqa: PLC0415

    cap = 16
    results, checks = manipulation.study_small(seed, 12 if quick else 120, cap)
    parts = [manipulation.report_small(results, checks, cap)]
    if not quick:
        parts.append(manipulation.report_scale(manipulation.study_scale(seed, attackers=6)))
    text = "\n\n".join(parts) + "\n"
    out.mkdir(parents=True, exist_ok=True)
    (out / "manipulation.md").write_text(text, encoding="utf-8")
    click.echo(text)


def _run_timing(out: Path, quick: bool, seed: int) -> None:
    """The timing study: seeds seed+1..seed+3 at 1.2x, 1.5x and 2x load, 100 targets each
    (--quick: one seed, 10 targets), its table printed and written to timing.md, its figure
    to timing.png."""
    from inference_auctions.experiments.starvation import starvation_table  # noqa: PLC0415
    from inference_auctions.experiments.timing import TimingSetup  # noqa: PLC0415
    from inference_auctions.experiments.timing_report import (  # noqa: PLC0415
        run_timing,
        timing_figure,
        timing_table,
    )

    seeds = (seed + 1,) if quick else (seed + 1, seed + 2, seed + 3)
    setup = TimingSetup(seeds=seeds, targets=10 if quick else 100)
    rows = run_timing(setup, lambda line: click.echo(line, err=True))
    starving = "Starvation inside a subtree:\n\n" + starvation_table(seed + 1)
    text = timing_table(setup, rows) + "\n\n" + starving + "\n"
    out.mkdir(parents=True, exist_ok=True)
    (out / "timing.md").write_text(text, encoding="utf-8")
    timing_figure(rows, out / "timing.png")
    click.echo(text)


def _live_schemes(given: str) -> tuple[str, ...]:
    from inference_auctions.experiments.live_run import SCHEMES  # noqa: PLC0415

    chosen = tuple(name.strip() for name in given.split(",") if name.strip())
    unknown = [name for name in chosen if name not in SCHEMES]
    if unknown or not chosen:
        raise click.BadParameter(
            f"{', '.join(unknown) or 'none given'}: choose among {', '.join(SCHEMES)}",
            param_hint="--schemes",
        )
    return chosen


def _run_live(
    out: Path,
    quick: bool,
    seed: int,
    engine_url: str | None,
    load: float,
    schemes: tuple[str, ...],
) -> None:
    """The live market: a run of the real server per scheme on one plan, a progress bar each."""
    from inference_auctions.experiments.live_market import (  # noqa: PLC0415
        FULL_SECONDS,
        QUICK_SECONDS,
        report,
        run_live,
        write_live,
    )
    from inference_auctions.experiments.live_run import ServerSetup  # noqa: PLC0415

    console = Console(stderr=True)
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=console) as progress:

        def start(scheme: str, total: int) -> Callable[[], None]:
            task = progress.add_task(f"live {scheme}", total=total)
            return lambda: progress.advance(task)

        seconds = QUICK_SECONDS if quick else FULL_SECONDS
        setup = ServerSetup(engine_url=engine_url)
        results = run_live(seconds, seed, setup, schemes=schemes, tracker=start, load=load)
    written = write_live(results, out)
    console.print(report(results))
    console.print(f"Wrote {', '.join(p.name for p in written)} to {out}.")
