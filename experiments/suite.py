"""Run figures end to end: measure every sweep, plot it, and write the report."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from inference_auctions.experiments.autobidding import AutobidRun, AutobidSettings, run_autobidding
from inference_auctions.experiments.figures import plot_autobidding, plot_sweeps
from inference_auctions.experiments.orders import ORDERS
from inference_auctions.experiments.plan import FULL, Scale, figure_sweeps
from inference_auctions.experiments.report import Results, machine, write_report
from inference_auctions.experiments.runner import Engine, run_sweep
from inference_auctions.experiments.workloads import OUTPUT_TOKENS
from inference_auctions.server.serving.deferral import DeferralSettings

__all__ = ["FIGURES", "Config", "Tracker", "run"]

FIGURES = ("figure1", "figure2", "figure3", "figure4")
TITLES = {
    "figure1": "Figure 1: stars (mixshare) — batch size, sharing fraction, value correlation",
    "figure2": "Figure 2: tree topologies at n = Q",
    "figure3": "Figure 3: one cluster bids, everyone else bids 0 (mixshare-50)",
}
TREE_VARIANTS = ("short", "long")


class Tracker(Protocol):
    """Progress reporting: `start` announces a task of `total` steps and returns its tick."""

    def start(self, description: str, total: int) -> Callable[[], None]:
        """Begin a task; the returned function advances it by one step."""
        ...


@dataclass(frozen=True, slots=True)
class Config:
    """What to run and where to write it."""

    figures: Sequence[str]
    out: Path
    scale: Scale = FULL
    trials: int = 3
    seed: int = 0
    orders: Sequence[str] = ORDERS
    workload_file: Path | None = None
    # Each query's output length is drawn from this inclusive range.
    output_tokens: tuple[int, int] = OUTPUT_TOKENS
    # The server's in-step prefix deferral rule for the auction's orders; None: off.
    deferral: DeferralSettings | None = field(default_factory=DeferralSettings)


def run(config: Config, tracker: Tracker | None = None) -> Results:
    """Measure, plot and report every figure of `config`; returns all the numbers."""
    engine = Engine(deferral=config.deferral)
    results = Results(settings=_settings(config, engine))
    config.out.mkdir(parents=True, exist_ok=True)
    for figure in config.figures:
        started = time.perf_counter()
        if figure == "figure4":
            results.autobidding = _autobidding(config, tracker)
            plot_autobidding(results.autobidding, config.out / "figure4.png")
        else:
            sweeps = figure_sweeps(figure, config.scale, config.workload_file, config.output_tokens)
            measured = []
            for sweep in sweeps:
                tick = _start(
                    tracker, f"{figure}: {sweep.title}", len(sweep.points) * config.trials
                )
                measured.append(
                    run_sweep(
                        sweep,
                        config.orders,
                        trials=config.trials,
                        seed=config.seed,
                        engine=engine,
                        advance=tick,
                    )
                )
            results.sweeps[figure] = measured
            plot_sweeps(measured, config.out / f"{figure}.png", _title(figure, config))
        results.elapsed[figure] = time.perf_counter() - started
    write_report(results, config.out)
    return results


def _autobidding(config: Config, tracker: Tracker | None) -> dict[str, list[AutobidRun]]:
    settings = AutobidSettings(auctions=config.scale.auctions, queue=config.scale.queue)
    runs: dict[str, list[AutobidRun]] = {}
    for variant in TREE_VARIANTS:
        tick = _start(
            tracker,
            f"figure4: {variant} trees, T={settings.auctions}",
            settings.auctions * config.trials,
        )
        runs[variant] = [
            run_autobidding(variant, settings, seed=config.seed, trial=trial, advance=tick)
            for trial in range(config.trials)
        ]
    return runs


def _start(tracker: Tracker | None, description: str, total: int) -> Callable[[], None]:
    if tracker is None:
        return lambda: None
    return tracker.start(description, total)


def _title(figure: str, config: Config) -> str:
    if config.workload_file is not None:
        return f"{config.workload_file.name}: {'batch size' if figure == 'figure1' else 'n = Q'}"
    return TITLES[figure]


def _settings(config: Config, engine: Engine) -> dict[str, object]:
    cost = engine.cost_model
    return {
        "figures": list(config.figures),
        "queue": config.scale.queue,
        "scale": {
            "batches": list(config.scale.batches),
            "shares": list(config.scale.shares),
            "rhos": list(config.scale.rhos),
            "share_batch": config.scale.share_batch,
            "auctions": config.scale.auctions,
        },
        "trials": config.trials,
        "seed": config.seed,
        "orders": list(config.orders),
        "workload_file": str(config.workload_file) if config.workload_file else None,
        "cache_tokens": engine.cache_tokens,
        "chunked_prefill_size": engine.chunked_prefill_size,
        "output_tokens": list(config.output_tokens),
        "deferral": None
        if engine.deferral is None
        else {
            "threshold_tokens": engine.deferral.threshold_tokens,
            "max_hold_seconds": engine.deferral.max_hold_seconds,
        },
        "cost_model": {
            "prefill_seconds_per_token": cost.prefill_seconds_per_token,
            "prefill_seconds_per_step": cost.prefill_seconds_per_step,
            "decode_seconds_per_step": cost.decode_seconds_per_step,
            "decode_seconds_per_context_token": cost.decode_seconds_per_context_token,
        },
        "machine": machine(),
    }
