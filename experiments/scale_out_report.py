"""Write the scale-out experiment: scale-out.png, scale-out.json and scale-out.md in a folder."""

from __future__ import annotations

import json
from pathlib import Path

from inference_auctions.experiments.figures import STYLE, _figure, _save
from inference_auctions.experiments.scale_out import BATCH, ROUTERS, SHARE, ScaleOutResult

__all__ = ["METRICS", "markdown_table", "plot_scale_out", "write_scale_out"]

METRICS = (
    ("welfare_percent", "welfare, % above ½Σb", 1.0),
    ("hit_rate", "cache hit rate, %", 100.0),
    ("mean_ttft", "mean TTFT, s", 1.0),
)
_ROUTER_LINES = {"prefix-aware": "-", "round-robin": ":"}


def plot_scale_out(result: ScaleOutResult, path: Path) -> None:
    """One panel per metric; a line per order and router (solid: prefix-aware)."""
    figure = _figure(13, 4)
    axes = figure.subplots(1, len(METRICS))
    for axis, (metric, label, scale) in zip(axes, METRICS, strict=True):
        for router in ROUTERS:
            for order, by_k in result.points[router].items():
                ks = sorted(by_k)
                means = [result.mean(router, order, k, metric)[0] * scale for k in ks]
                style = STYLE[order]
                axis.plot(
                    ks,
                    means,
                    color=style.color,
                    marker=style.marker,
                    linestyle=_ROUTER_LINES[router],
                    label=f"{order}, {router}",
                )
        axis.set_xscale("log", base=2)
        axis.set_xticks(sorted(next(iter(result.points[ROUTERS[0]].values()))))
        axis.set_xticklabels(
            [str(k) for k in sorted(next(iter(result.points[ROUTERS[0]].values())))]
        )
        axis.set_xlabel("workers K (an auction each)")
        axis.set_ylabel(label)
        axis.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    figure.suptitle(
        f"Scale-out: mixshare-{SHARE:g}, Q = {result.queue}, batches of {BATCH} per worker, "
        f"{result.trials} trials; solid = prefix-aware router (SMG cache_aware), "
        "dotted = round robin"
    )
    figure.tight_layout(rect=(0, 0, 1, 0.93))
    _save(figure, path)


def markdown_table(result: ScaleOutResult) -> str:
    """Mean (± standard error) of every metric per K, order and router."""
    lines = [
        "| K | order | router | welfare, % above ½Σb | cache hit rate | mean TTFT, s "
        "| busiest worker's share |",
        "|---|---|---|---|---|---|---|",
    ]
    orders = list(result.points[ROUTERS[0]])
    ks = sorted(result.points[ROUTERS[0]][orders[0]])
    for k in ks:
        for order in orders:
            for router in ROUTERS if k > 1 else ROUTERS[:1]:
                cells = []
                for metric, _, scale in (*METRICS, ("busiest_share", "", 100.0)):
                    mean, error = result.mean(router, order, k, metric)
                    digits = 2 if metric == "mean_ttft" else 1
                    unit = "%" if scale == 100.0 else ""
                    cells.append(f"{mean * scale:.{digits}f}{unit} ± {error * scale:.{digits}f}")
                name = router if k > 1 else "(one worker)"
                lines.append(f"| {k} | {order} | {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def write_scale_out(result: ScaleOutResult, out: Path) -> list[Path]:
    """Write the figure, the numbers and the table to `out`; return the paths."""
    out.mkdir(parents=True, exist_ok=True)
    figure, numbers, table = out / "scale-out.png", out / "scale-out.json", out / "scale-out.md"
    plot_scale_out(result, figure)
    numbers.write_text(json.dumps(result.as_json(), indent=1) + "\n")
    table.write_text(markdown_table(result))
    return [figure, numbers, table]
