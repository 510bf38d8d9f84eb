"""The timing study's tables and figure (docs/RESULTS.md, "Timing")."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from inference_auctions.experiments.timing import (
    FAMILIES,
    Market,
    RuleSummary,
    TargetResult,
    TimingSetup,
    study_market,
    summarize,
)
from inference_auctions.experiments.timing_model import RULES

__all__ = ["run_timing", "timing_figure", "timing_table"]

RULE_NAMES = {
    "dispatch": "(a) at-dispatch charge",
    "floor": "(b) + posted floor",
    "horizon": "(c) settled over a horizon",
}


def run_timing(
    setup: TimingSetup, progress: Callable[[str], None] | None = None
) -> list[RuleSummary]:
    """Every seed at every load; one summary per rule and load."""
    rows: list[RuleSummary] = []
    for load in setup.loads:
        markets: list[Market] = []
        results: list[TargetResult] = []
        for seed in setup.seeds:
            market, found = study_market(setup, seed, load)
            markets.append(market)
            results.extend(found)
            if progress is not None:
                progress(f"load {load:g}, seed {seed}: {len(found)} targets")
        rows.extend(summarize(rule, load, results, markets) for rule in RULES)
    return rows


def timing_table(setup: TimingSetup, rows: Sequence[RuleSummary]) -> str:
    """The markdown table, one row per rule and load."""
    head = (
        "| rule | load | targets | profitable | worst seed | by > 1% | "
        + " | ".join(FAMILIES)
        + " | median gain | p90 gain | welfare | revenue |"
    )
    lines = [
        f"Slot model of the live plan: {setup.starts} starts per slot, K = {setup.slots}, "
        f"seeds {', '.join(map(str, setup.seeds))}, {setup.targets} targets per seed and load; "
        f"floor target {setup.floor_target} bidders; horizon {setup.horizon} slots. "
        "Worst seed: the profitable share of the seed where it is highest. "
        "By > 1%: share of targets with a deviation that gains more than 1% of their value. "
        "Family columns: share of targets for which some deviation of that family is "
        "profitable. Gains in percent of the target's value (0 where none gains); welfare and "
        "revenue in percent of all value sent ((c): the targets' truthful charges).",
        "",
        head,
        "|" + "---|" * (head.count("|") - 1),
    ]
    for row in rows:
        families = " | ".join(f"{100 * row.by_family[f]:.0f}%" for f in FAMILIES)
        lines.append(
            f"| {RULE_NAMES[row.rule]} | {row.load:g}x | {row.targets} | "
            f"{100 * row.profitable:.0f}% | {100 * row.worst_seed:.0f}% | "
            f"{100 * row.material:.0f}% | {families} | "
            f"{row.median_gain:.1f}% | {row.p90_gain:.1f}% | "
            f"{row.welfare:.1f}% | {row.revenue:.1f}% |"
        )
    return "\n".join(lines)


def timing_figure(rows: Sequence[RuleSummary], path: Path) -> None:
    """Share of targets with a profitable deviation, and the p90 gain, by rule and load."""
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    loads = sorted({row.load for row in rows})
    figure, (share, gain) = plt.subplots(1, 2, figsize=(10, 3.8))
    width = 0.8 / len(RULES)
    for number, rule in enumerate(RULES):
        mine = {row.load: row for row in rows if row.rule == rule}
        places = [index + number * width for index in range(len(loads))]
        share.bar(
            places, [100 * mine[load].profitable for load in loads], width, label=RULE_NAMES[rule]
        )
        gain.bar(places, [mine[load].p90_gain for load in loads], width, label=RULE_NAMES[rule])
    for axis, label in (
        (share, "targets with a profitable deviation (%)"),
        (gain, "p90 gain (% of value)"),
    ):
        axis.set_xticks(
            [index + width for index in range(len(loads))], [f"{load:g}x" for load in loads]
        )
        axis.set_xlabel("load")
        axis.set_ylabel(label)
    share.axhline(15, color="grey", linestyle="--", linewidth=0.8)
    share.legend(fontsize=8)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=120)
    plt.close(figure)
