"""The figures, drawn like the paper's: one panel per metric and sweep, one line per order.

Figures are built with matplotlib's object API on an Agg canvas: files only, no display, and
no pyplot global state, so nothing stays open between figures, runs or tests. PNGs are written
with a 64-colour palette (Pillow, which matplotlib itself depends on): the same picture in a
quarter of the bytes, which matters for the copies committed under docs/figures.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from PIL import Image

from inference_auctions.experiments.autobidding import AutobidRun
from inference_auctions.experiments.metrics import mean_and_stderr
from inference_auctions.experiments.runner import Measurement, SweepResult

__all__ = ["METRICS", "plot_autobidding", "plot_sweeps"]

# (attribute of Measurement, axis label, scale applied before plotting)
METRICS = (
    ("welfare_percent", "welfare, % above ½Σb", 1.0),
    ("hit_rate", "cache hit rate, %", 100.0),
    ("mean_ttft", "mean TTFT, s", 1.0),
)


@dataclass(frozen=True, slots=True)
class _Style:
    color: str
    marker: str
    linestyle: Literal["-", "--", ":"]


STYLE = {
    "dfs-bid": _Style("#1f77b4", "o", "-"),
    "dfs-uniform": _Style("#ff7f0e", "s", "-"),
    "bid-sort": _Style("#2ca02c", "^", "--"),
    "no-sort": _Style("#7f7f7f", "x", ":"),
}
DPI = 100


def plot_sweeps(results: Sequence[SweepResult], path: Path, title: str) -> None:
    """Save a grid: metrics down, sweeps across (a single sweep is laid out as one row)."""
    single = len(results) == 1
    rows, cols = (1, len(METRICS)) if single else (len(METRICS), len(results))
    figure = _figure(4.2 * cols, 3.2 * rows + 0.55)
    axes = figure.subplots(rows, cols, squeeze=False)
    for column, result in enumerate(results):
        for row, metric in enumerate(METRICS):
            axis = axes[0][row] if single else axes[row][column]
            if result.sweep.categorical:
                _bars(axis, result, metric)
            else:
                _lines(axis, result, metric)
            axis.set_ylabel(metric[1])
            if single:
                axis.set_title(metric[1].split(",")[0], fontsize=10)
            elif row == 0:
                axis.set_title(result.sweep.title, fontsize=10)
            axis.grid(alpha=0.3)
    _header(figure, title, axes[0][0])
    _save(figure, path)


def _header(figure: Figure, title: str, axis: Axes) -> None:
    """The title, and under it one legend for every panel; the panels fill the rest."""
    height = figure.get_figheight()
    # Fixed heights in inches, so that one-row and three-row figures get the same header.
    title_y, legend_y, top = 1 - 0.1 / height, 1 - 0.36 / height, 1 - 0.55 / height
    figure.suptitle(title, x=0.01, y=title_y, ha="left", va="top", fontsize=11)
    handles, labels = axis.get_legend_handles_labels()
    figure.legend(
        handles,
        labels,
        loc="center",
        bbox_to_anchor=(0.5, legend_y),
        ncol=len(labels),
        frameon=False,
    )
    figure.tight_layout(rect=(0, 0, 1, top))


def _save(figure: Figure, path: Path) -> None:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=DPI)
    buffer.seek(0)
    with Image.open(buffer) as image:
        palette = image.convert("RGB").quantize(colors=64, method=Image.Quantize.MEDIANCUT)
        palette.save(path, format="png", optimize=True)


def _figure(width: float, height: float) -> Figure:
    figure = Figure(figsize=(width, height))
    FigureCanvasAgg(figure)
    return figure


def _summary(
    result: SweepResult, order: str, metric: tuple[str, str, float]
) -> tuple[list[float], list[float]]:
    attribute, _, scale = metric
    means, errors = [], []
    for trials in result.measurements[order]:
        mean, error = mean_and_stderr([scale * _value(m, attribute) for m in trials])
        means.append(mean)
        errors.append(error)
    return means, errors


def _value(measurement: Measurement, attribute: str) -> float:
    return float(getattr(measurement, attribute))


def _lines(axis: Axes, result: SweepResult, metric: tuple[str, str, float]) -> None:
    xs = [float(point.x) for point in result.sweep.points]
    for order in result.measurements:
        means, errors = _summary(result, order, metric)
        style = STYLE[order]
        axis.errorbar(
            xs,
            means,
            yerr=errors,
            label=order,
            capsize=3,
            markersize=4,
            color=style.color,
            marker=style.marker,
            linestyle=style.linestyle,
        )
    axis.set_xlabel(result.sweep.x_label)
    if result.sweep.key in ("batch", "one-cluster"):
        axis.set_xscale("log", base=2)
        axis.set_xticks(xs, [f"{x:g}" for x in xs])
        axis.minorticks_off()


def _bars(axis: Axes, result: SweepResult, metric: tuple[str, str, float]) -> None:
    names = [str(point.x) for point in result.sweep.points]
    orders = list(result.measurements)
    width = 0.8 / len(orders)
    for k, order in enumerate(orders):
        means, errors = _summary(result, order, metric)
        offsets = np.arange(len(names)) + (k - (len(orders) - 1) / 2) * width
        axis.bar(
            offsets, means, width, yerr=errors, capsize=2, label=order, color=STYLE[order].color
        )
    axis.set_xticks(range(len(names)), names)
    if metric[0] == "mean_ttft":
        # Long trees under bid-sort dwarf the rest; a log axis keeps every bar readable.
        axis.set_yscale("log")


def plot_autobidding(runs: dict[str, list[AutobidRun]], path: Path) -> None:
    """Save Figure 4: per tree variant, welfare against truthful and the bound, spend, alpha."""
    variants = list(runs)
    figure = _figure(13, 3.3 * len(variants))
    axes = figure.subplots(len(variants), 3, squeeze=False)
    for row, variant in enumerate(variants):
        trials = runs[variant]
        _welfare_panel(axes[row][0], trials, variant)
        _spend_panel(axes[row][1], trials[0], variant)
        _alpha_panel(axes[row][2], trials[0], variant)
    figure.suptitle("Figure 4: pacing autobidders over repeated auctions", x=0.01, ha="left")
    figure.tight_layout()
    _save(figure, path)


def _welfare_panel(axis: Axes, trials: list[AutobidRun], variant: str) -> None:
    horizon = len(trials[0].truthful)
    t = np.arange(1, horizon + 1)
    for label, attribute, style in (
        ("paced / truthful", "paced", "-"),
        ("Thm 4.4 bound / truthful", "bound", "--"),
    ):
        values = np.array(
            [100.0 * np.divide(getattr(run, attribute), run.truthful) for run in trials]
        )
        mean = values.mean(axis=0)
        error = values.std(axis=0, ddof=1) / np.sqrt(len(trials)) if len(trials) > 1 else 0 * mean
        axis.plot(t, mean, style, label=label)
        axis.fill_between(t, mean - error, mean + error, alpha=0.25)
    axis.axhline(100.0, color="black", linewidth=0.8)
    axis.set_title(f"{variant} trees: welfare per auction", fontsize=10)
    axis.set_xlabel("auction t")
    axis.set_ylabel("% of truthful welfare")
    axis.legend(fontsize=8, loc="lower left")
    axis.grid(alpha=0.3)


def _spend_panel(axis: Axes, run: AutobidRun, variant: str) -> None:
    horizon = len(run.truthful)
    t = np.arange(1, horizon + 1)
    for user, spend in run.spend.items():
        axis.plot(t, 100.0 * np.asarray(spend) / run.budgets[user], linewidth=1, alpha=0.7)
    axis.plot(t, 100.0 * t / horizon, "k--", linewidth=1.2, label="plan (γ·t)")
    axis.set_title(f"{variant} trees: cumulative spend, one line per user", fontsize=10)
    axis.set_xlabel("auction t")
    axis.set_ylabel("% of budget")
    axis.legend(fontsize=8, loc="upper left")
    axis.grid(alpha=0.3)


def _alpha_panel(axis: Axes, run: AutobidRun, variant: str) -> None:
    t = np.arange(1, len(run.truthful) + 1)
    for alphas in run.alphas.values():
        axis.plot(t, alphas, linewidth=1, alpha=0.7)
    axis.set_ylim(0, 1.05)
    axis.set_title(f"{variant} trees: pacing multiplier α per user", fontsize=10)
    axis.set_xlabel("auction t")
    axis.set_ylabel("α = 1/(1+μ)")
    axis.grid(alpha=0.3)
