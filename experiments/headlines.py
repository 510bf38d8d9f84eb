"""The paper's headline numbers (SPEC section 3), each next to the same quantity from our run.

Comparisons between orders are taken per trial, where both orders served the very same queue,
and then averaged with one standard error. The welfare lead of A over B is the vertical gap
between them in the welfare panel, `(W_A - W_B) / (sum(b) / 2)` in points of "% above half the
bids": the paper reads its leads off those panels, and the gap, unlike `W_A / W_B`, does not
blow up in a trial where B happens to serve a huge bid last.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from inference_auctions.experiments.autobidding import AutobidRun
from inference_auctions.experiments.metrics import mean_and_stderr
from inference_auctions.experiments.runner import Measurement, SweepResult

__all__ = ["Headline", "headlines"]

Trial = Mapping[str, Measurement]


@dataclass(frozen=True, slots=True)
class Headline:
    """One claim of the paper: its number and ours."""

    figure: str
    claim: str
    paper: str
    ours: str


def headlines(
    sweeps: Mapping[str, Sequence[SweepResult]], autobidding: Mapping[str, Sequence[AutobidRun]]
) -> list[Headline]:
    """Every headline whose figure and orders were part of this run."""
    rows: list[Headline] = []
    for make in (_figure1, _figure2, _figure3):
        rows.extend(make(sweeps))
    rows.extend(_equal_cache(sweeps))
    if autobidding:
        rows.extend(_figure4(autobidding))
    return rows


def _find(sweeps: Mapping[str, Sequence[SweepResult]], key: str) -> SweepResult | None:
    for results in sweeps.values():
        for result in results:
            if result.sweep.key == key:
                return result
    return None


def _has(result: SweepResult | None, *orders: str) -> bool:
    return result is not None and all(order in result.measurements for order in orders)


def _samples(result: SweepResult, index: int, quantity: Callable[[Trial], float]) -> list[float]:
    """`quantity` of each trial at point `index`, every order of that trial at hand."""
    trials = len(next(iter(result.measurements.values()))[index])
    return [
        quantity({order: result.measurements[order][index][t] for order in result.measurements})
        for t in range(trials)
    ]


def _paired(result: SweepResult, index: int, quantity: Callable[[Trial], float]) -> float:
    return mean_and_stderr(_samples(result, index, quantity))[0]


def _paired_text(result: SweepResult, index: int, quantity: Callable[[Trial], float]) -> str:
    mean, error = mean_and_stderr(_samples(result, index, quantity))
    return f"{mean:+.1f} ± {error:.1f} points"


def _lead(a: str, b: str) -> Callable[[Trial], float]:
    return lambda m: m[a].welfare_percent - m[b].welfare_percent


def _ttft_ratio(a: str, b: str) -> Callable[[Trial], float]:
    return lambda m: m[a].mean_ttft / m[b].mean_ttft


def _x(result: SweepResult, index: int) -> str:
    x = result.sweep.points[index].x
    return x if isinstance(x, str) else f"{x:g}"


def _figure1(sweeps: Mapping[str, Sequence[SweepResult]]) -> list[Headline]:
    rows = []
    batch = _find(sweeps, "batch")
    if _has(batch, "dfs-bid", "dfs-uniform") and batch is not None:
        lead = _lead("dfs-bid", "dfs-uniform")
        last = len(batch.sweep.points) - 1
        rows.append(
            Headline(
                "1 (left)",
                "dfs-bid's welfare lead over dfs-uniform, mixshare-50, smallest to largest n",
                "~1% at n=32, ~12% at n=Q",
                f"{_paired_text(batch, 0, lead)} at n={_x(batch, 0)}, "
                f"{_paired_text(batch, last, lead)} at n={_x(batch, last)}",
            )
        )
    share = _find(sweeps, "share")
    if _has(share, "dfs-bid", "dfs-uniform") and share is not None:
        lead = _lead("dfs-bid", "dfs-uniform")
        values = [_paired(share, i, lead) for i in range(len(share.sweep.points))]
        listed = ", ".join(f"P={_x(share, i)}: {v:+.1f}" for i, v in enumerate(values))
        rows.append(
            Headline(
                "1 (middle)",
                "dfs-bid's lead over dfs-uniform across sharing fractions, "
                f"n={share.sweep.points[0].batch}",
                "+4 to +7%",
                f"{min(values):+.1f} to {max(values):+.1f} points ({listed})",
            )
        )
    rho = _find(sweeps, "rho")
    if _has(rho, "dfs-bid", "dfs-uniform") and rho is not None:
        lead = _lead("dfs-bid", "dfs-uniform")
        values = [_paired(rho, i, lead) for i in range(len(rho.sweep.points))]
        best = max(range(len(values)), key=values.__getitem__)
        rows.append(
            Headline(
                "1 (right)",
                "dfs-bid's lead over dfs-uniform with values correlated within clusters",
                "up to +100%",
                f"up to {values[best]:+.1f} points (rho={_x(rho, best)}); "
                + ", ".join(f"rho={_x(rho, i)}: {v:+.1f}" for i, v in enumerate(values)),
            )
        )
    return rows


def _figure2(sweeps: Mapping[str, Sequence[SweepResult]]) -> list[Headline]:
    topology = _find(sweeps, "topology")
    if topology is None or not _has(topology, "dfs-bid", "dfs-uniform", "bid-sort"):
        return []
    names = [str(point.x) for point in topology.sweep.points]
    lead = _lead("dfs-bid", "dfs-uniform")
    leads = {name: _paired(topology, i, lead) for i, name in enumerate(names)}
    share = {
        name: _paired(topology, i, lambda m: 100.0 * m["dfs-bid"].welfare / m["bid-sort"].welfare)
        for i, name in enumerate(names)
    }
    slower = {
        name: _paired(topology, i, _ttft_ratio("bid-sort", "dfs-bid"))
        for i, name in enumerate(names)
    }
    rows = [
        Headline(
            "2",
            "dfs-bid's welfare lead over dfs-uniform, i.i.d. values, n=Q",
            "+12 to +18.6%",
            ", ".join(f"{name} {value:+.1f}" for name, value in leads.items()) + " points",
        ),
        Headline(
            "2",
            "dfs-bid's welfare as a share of bid-sort's, n=Q",
            "~80% (within 19-22%)",
            ", ".join(f"{name} {value:.0f}%" for name, value in share.items()),
        ),
    ]
    for name, paper in (("chains", "2.4x"), ("long trees", "12x")):
        if name in slower:
            rows.append(
                Headline(
                    "2",
                    f"bid-sort's mean TTFT over dfs-bid's, {name}",
                    paper,
                    f"{slower[name]:.1f}x",
                )
            )
    if "short trees" in names:
        i = names.index("short trees")
        hits = ", ".join(
            f"{order} {100 * _mean(topology, order, i, 'hit_rate'):.0f}%"
            for order in topology.measurements
        )
        ttfts = ", ".join(
            f"{order} {_mean(topology, order, i, 'mean_ttft'):.1f} s"
            for order in topology.measurements
        )
        evicted = ", ".join(
            f"{order} {_mean(topology, order, i, 'evicted_tokens'):,.0f}"
            for order in topology.measurements
        )
        rows += [
            Headline(
                "2",
                "short trees (fit in cache): hit rate and mean TTFT by order",
                "no difference",
                f"hit rate {hits}; TTFT {ttfts}; tokens evicted {evicted}",
            ),
            Headline(
                "2",
                "short trees: welfare the DFS restriction costs (1 - dfs-bid / bid-sort)",
                "~20%",
                f"{100 - share['short trees']:.0f}%",
            ),
        ]
    return rows


def _figure3(sweeps: Mapping[str, Sequence[SweepResult]]) -> list[Headline]:
    one = _find(sweeps, "one-cluster")
    if one is None or not _has(one, "dfs-bid", "dfs-uniform", "bid-sort"):
        return []
    points = range(len(one.sweep.points))
    gap = [
        _paired(one, i, lambda m: m["dfs-bid"].welfare_percent - m["bid-sort"].welfare_percent)
        for i in points
    ]
    hit = [
        _paired(one, i, lambda m: 100.0 * (m["dfs-bid"].hit_rate - m["dfs-uniform"].hit_rate))
        for i in points
    ]
    slower = [_paired(one, i, _ttft_ratio("bid-sort", "dfs-bid")) for i in points]
    last = len(slower) - 1
    return [
        Headline(
            "3",
            "one cluster bids: dfs-bid's welfare minus bid-sort's (points of % above ½Σb)",
            "equal",
            f"largest gap {max(gap, key=abs):+.2f} points over n",
        ),
        Headline(
            "3",
            "one cluster bids: dfs-bid's hit rate minus dfs-uniform's",
            "equal",
            f"largest gap {max(hit, key=abs):+.1f} points over n",
        ),
        Headline(
            "3",
            "one cluster bids: bid-sort's mean TTFT over dfs-bid's",
            "~1.5x",
            f"{slower[last]:.2f}x at n={_x(one, last)} "
            f"({min(slower):.2f}x-{max(slower):.2f}x over n)",
        ),
    ]


def _equal_cache(sweeps: Mapping[str, Sequence[SweepResult]]) -> list[Headline]:
    hits: list[tuple[float, str]] = []
    ttfts: list[tuple[float, str]] = []
    for results in sweeps.values():
        for result in results:
            if not _has(result, "dfs-bid", "dfs-uniform"):
                continue
            for i in range(len(result.sweep.points)):
                where = f"{result.sweep.key} {_x(result, i)}"
                hits.append(
                    (
                        _paired(
                            result,
                            i,
                            lambda m: 100.0 * (m["dfs-bid"].hit_rate - m["dfs-uniform"].hit_rate),
                        ),
                        where,
                    )
                )
                ttfts.append(
                    (
                        100.0 * (_paired(result, i, _ttft_ratio("dfs-bid", "dfs-uniform")) - 1.0),
                        where,
                    )
                )
    if not hits:
        return []
    hit_worst = max(hits, key=lambda h: abs(h[0]))
    ttft_worst = max(ttfts, key=lambda h: abs(h[0]))
    return [
        Headline(
            "1-3",
            f"dfs-bid's hit rate minus dfs-uniform's, over all {len(hits)} points",
            "equal",
            f"median {_median([abs(h) for h, _ in hits]):.1f} points; largest "
            f"{hit_worst[0]:+.1f} ({hit_worst[1]})",
        ),
        Headline(
            "1-3",
            f"dfs-bid's mean TTFT over dfs-uniform's, over all {len(ttfts)} points",
            "equal",
            f"median {_median([abs(t) for t, _ in ttfts]):.1f}% apart; largest "
            f"{ttft_worst[0]:+.1f}% ({ttft_worst[1]})",
        ),
    ]


def _figure4(autobidding: Mapping[str, Sequence[AutobidRun]]) -> list[Headline]:
    ratios, percent, above = [], [], []
    for variant, runs in autobidding.items():
        mean, error = mean_and_stderr([100.0 * (1.0 - run.welfare_ratio) for run in runs])
        ratios.append(f"{variant} trees {mean:.1f}% ± {error:.1f}")
        drop = mean_and_stderr(
            [
                100.0 * (1.0 - math.fsum(run.paced_percent) / math.fsum(run.truthful_percent))
                for run in runs
            ]
        )
        percent.append(f"{variant} trees {drop[0]:.0f}% ± {drop[1]:.0f}")
        held = sum(p >= b for run in runs for p, b in zip(run.paced, run.bound, strict=True))
        total = sum(len(run.paced) for run in runs)
        margin = min(run.bound_margin for run in runs)
        above.append(
            f"{variant} trees {held}/{total} auctions (smallest welfare/bound {margin:.3f})"
        )
    return [
        Headline(
            "4",
            "autobidding: welfare below single-shot truthful bidding",
            "~10%",
            f"W(σ; v): {'; '.join(ratios)}. Welfare above ½Σv: {'; '.join(percent)}",
        ),
        Headline(
            "4",
            "autobidding: welfare at or above the Theorem 4.4 bound",
            "always",
            "; ".join(above),
        ),
    ]


def _mean(result: SweepResult, order: str, index: int, attribute: str) -> float:
    return mean_and_stderr(
        [float(getattr(m, attribute)) for m in result.measurements[order][index]]
    )[0]


def _median(values: Sequence[float]) -> float:
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2
