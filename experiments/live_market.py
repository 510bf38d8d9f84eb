"""`inference-auction experiment live`: the auction against fixed-price tiers and first come,
first served, through the real server, with SDK clients (docs/RESULTS.md, "The market, live").

One plan (`live_plan`), four runs (`live_run`), one set of measures each (`live_metrics`),
written to results.json under the keys `fcfs`, `tiers2`, `tiers3` and `auction` (and
`settings`), live.md, and live.png: TTFT by value decile, one line per scheme; welfare and
revenue bars.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from matplotlib.axes import Axes

from inference_auctions.experiments.figures import _figure, _save
from inference_auctions.experiments.live_metrics import WINDOW_SECONDS, measure
from inference_auctions.experiments.live_plan import CLASSES, PARETO_SHAPE, LivePlan, make_plan
from inference_auctions.experiments.live_run import (
    DEFAULT_SCHEMES,
    SCHEMES,
    ServerSetup,
    engine_capacity_at,
    run_scheme,
)

__all__ = ["FULL_SECONDS", "QUICK_SECONDS", "run_live", "write_live"]

QUICK_SECONDS = 10.0
# Against a real SGLang server (its CPU test model: a context of 2,048 tokens), prompts of a
# quarter of the words.
SGLANG_PROMPT_SCALE = 0.25
FULL_SECONDS = 60.0
_COLORS = {
    "fcfs": "#7f7f7f",
    "tiers2": "#ff7f0e",
    "tiers3": "#2ca02c",
    "auction": "#1f77b4",
    "auction-no-floor": "#9467bd",
}

# (scheme, planned requests) -> a callback ticking once per finished request
Tracker = Callable[[str, int], Callable[[], None]]


def _no_progress(_scheme: str, _total: int) -> Callable[[], None]:
    return lambda: None


def run_live(
    seconds: float,
    seed: int,
    setup: ServerSetup | None = None,
    schemes: tuple[str, ...] = DEFAULT_SCHEMES,
    tracker: Tracker = _no_progress,
    load: float = 1.5,
) -> dict[str, Any]:
    """Plan once, run every scheme on the plan, measure each: results.json's contents."""
    setup = setup or ServerSetup()
    url = setup.engine_url
    plan = make_plan(
        seed,
        seconds,
        load=load,
        max_running_requests=setup.max_running_requests,
        cache_tokens=setup.cache_tokens,
        # A real engine is measured; its small test model holds a shorter context.
        capacity=None if url is None else (lambda sample: engine_capacity_at(url, sample)),
        prompt_scale=1.0 if url is None else SGLANG_PROMPT_SCALE,
    )
    results: dict[str, Any] = {"settings": _settings(plan, setup)}
    for scheme in schemes:
        tick = tracker(scheme, len(plan.requests))
        results[scheme] = measure(run_scheme(scheme, plan, setup, tick), plan)
    return results


def _settings(plan: LivePlan, setup: ServerSetup) -> dict[str, Any]:
    return {
        "seed": plan.seed,
        "seconds": plan.seconds,
        "load": plan.load,
        "engine_capacity_rps": round(plan.capacity_rps, 3),
        "requests": len(plan.requests),
        "budget_share": plan.budget_share,
        "value_law": f"scale x (1 + Lomax({PARETO_SHAPE})) micro-credits",
        "classes": [
            {
                "name": c.name,
                "tenants": c.tenants,
                "value_scale_micros": c.value_scale_micros,
                "rate_weight": c.rate_weight,
                "output_tokens": c.output_tokens,
                "prefix_words": c.prefix_words,
                "shared_prefix": c.shared_prefix,
            }
            for c in CLASSES
        ],
        "welfare_window_seconds": WINDOW_SECONDS,
        "engine": "embedded emulator, H100 cost model at real time"
        if setup.engine_url is None
        else f"SGLang at {setup.engine_url}, capacity measured",
        "max_running_requests": setup.max_running_requests
        if setup.engine_url is None
        else "the engine's own",
        "cache_tokens": setup.cache_tokens,
        "batch_size": setup.batch_size,
        "priority_slots": setup.batch_size,
        "max_inflight": setup.max_inflight,
        "shares": "zero_bid_share 0.5, user_share 0.5 (the defaults)",
        "request_fee_micros": setup.request_fee_micros,
        "budgets_micros": plan.budgets,
    }


def write_live(results: dict[str, Any], out: Path) -> list[Path]:
    """results.json, live.md and live.png in `out`."""
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "results.json", out / "live.md", out / "live.png"]
    paths[0].write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    paths[1].write_text(report(results), encoding="utf-8")
    _plot(results, paths[2])
    return paths


def _schemes(results: dict[str, Any]) -> list[str]:
    return [s for s in SCHEMES if s in results]


def report(results: dict[str, Any]) -> str:
    """The table of every scheme's headline measures, in Markdown."""
    settings = results["settings"]
    lines = [
        f"Live market: {settings['requests']} requests over {settings['seconds']:.0f} s at "
        f"{settings['load']}x the engine's capacity ({settings['engine_capacity_rps']} "
        f"requests/s), seed {settings['seed']}, request fee {settings['request_fee_micros']}.",
        "",
        "| scheme | welfare, % above ½Σv | overlap welfare, % above ½ | value-weighted TTFT, ms "
        "| mean TTFT, ms | p50 TTFT top decile, ms | p50 TTFT bottom decile, ms | revenue, "
        "credits | cache hit rate | last first token, s | served | overspent |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for scheme in _schemes(results):
        r = results[scheme]
        lines.append(
            f"| {scheme} | {r['welfare_percent']:.1f} | {r['overlap_welfare_percent']:.1f} | "
            f"{r['value_weighted_ttft_ms']} | "
            f"{r['mean_ttft_ms']} | {r['ttft_p50_ms_by_value_decile'][-1]} | "
            f"{r['ttft_p50_ms_by_value_decile'][0]} | {r['revenue_micros'] / 1e6:.6f} | "
            f"{r['cache_hit_rate']:.3f} | {r['last_first_token_s']} | "
            f"{r['requests_served']}/{r['requests']} | "
            f"{len(r['overspent_tenants'])} |"
        )
    return "\n".join(lines) + "\n"


def _plot(results: dict[str, Any], path: Path) -> None:
    schemes = _schemes(results)
    figure = _figure(13.5, 3.8)
    ttft, welfare_axis, revenue_axis = figure.subplots(1, 3, width_ratios=[2, 1, 1])
    _ttft_lines(ttft, results, schemes)
    colors = [_COLORS[s] for s in schemes]
    welfare_axis.bar(schemes, [results[s]["welfare_percent"] for s in schemes], color=colors)
    welfare_axis.set_title("welfare, % above ½Σv")
    revenue_axis.bar(schemes, [results[s]["revenue_micros"] / 1e6 for s in schemes], color=colors)
    revenue_axis.set_title("revenue, credits")
    for axis in (welfare_axis, revenue_axis):
        axis.grid(axis="y", alpha=0.3)
    settings = results["settings"]
    figure.suptitle(
        f"The market, live: {settings['requests']} requests at {settings['load']}x capacity "
        f"over {settings['seconds']:.0f} s ({settings['engine']})"
    )
    figure.tight_layout()
    _save(figure, path)


def _ttft_lines(axis: Axes, results: dict[str, Any], schemes: list[str]) -> None:
    deciles = list(range(1, 11))
    for scheme in schemes:
        values = [
            float("nan") if v is None else v / 1000
            for v in results[scheme]["ttft_p50_ms_by_value_decile"]
        ]
        axis.plot(deciles, values, marker="o", color=_COLORS[scheme], label=scheme)
    axis.set_xlabel("value decile (10: the most valuable requests)")
    axis.set_ylabel("p50 TTFT, s")
    axis.set_xticks(deciles)
    axis.grid(alpha=0.3)
    axis.legend()
