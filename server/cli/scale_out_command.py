"""`inference-auction experiment scale-out`: K workers behind a bid-blind router, simulated."""

from __future__ import annotations

from pathlib import Path

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

QUEUE_FULL = 1024
QUEUE_QUICK = 256


def run_scale_out_target(
    out: Path,
    quick: bool,
    trials: int,
    seed: int,
    orders: tuple[str, ...] | None,
    output_tokens: tuple[int, int],
) -> None:
    """Run the scale-out experiment and write its figure, numbers and table to `out`."""
    # Imported here: the rest of the CLI should not wait for numpy and matplotlib.
    from inference_auctions.experiments.scale_out import ORDERS, WORKER_COUNTS, run_scale_out  # noqa: PLC0415
    from inference_auctions.experiments.scale_out_report import write_scale_out  # noqa: PLC0415

    chosen = orders or ORDERS
    trials = 1 if quick else trials
    console = Console(stderr=True)
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn())
    with Progress(*columns, TimeElapsedColumn(), console=console) as progress:
        task = progress.add_task("scale-out (K workers)", total=trials * len(WORKER_COUNTS))
        result = run_scale_out(
            queue=QUEUE_QUICK if quick else QUEUE_FULL,
            trials=trials,
            seed=seed,
            orders=chosen,
            outputs=output_tokens,
            advance=lambda: progress.advance(task),
        )
    written = write_scale_out(result, out)
    click.echo((out / "scale-out.md").read_text(), nl=False)
    click.echo(f"Wrote {', '.join(path.name for path in written)} to {out}.")
