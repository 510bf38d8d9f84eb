"""The live market experiment's measures of one run (docs/RESULTS.md, "The market, live").

* `welfare`: value-weighted priority, as the paper measures it on the realized order. The
  requests are grouped by arrival in windows of `WINDOW_SECONDS` (the requests that wait
  together for the same engine); within a window of `n`, the request whose first token came
  `k`-th has priority `(n-1-k)/(n-1)` (1 alone), one that failed ranks last. `welfare_micros`
  is the sum of value x priority; `welfare_percent` is how far it lies above half the window's
  values (what a random order gets on average), over all windows.
* `overlap_welfare_percent`: a measure that does not punish serving a request at once: for each
  request, the share of the requests whose waits overlapped its own (from sending to first
  token) that got their first token after it, weighed by its value; as a percent above one half
  (what a random order gets). A request served at once overlaps few and loses nothing by it.
* `last_first_token_s`: when the last first token came, from the run's start: how long the
  scheme takes to start everything (a scheme that wastes the cache takes longer).
* `value_weighted_ttft_ms`: the mean time to first token, each request weighed by its value.
* `ttft_p50_ms_by_value_decile`, `ttft_p95_ms_by_value_decile`: deciles of the plan's values
  (the same boundaries for every scheme), lowest first.
* `revenue_micros`: the ledger's charges net of refunds; `overspent_tenants`: the tenants whose
  spend exceeds their budget (none, if the budgets hold).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from inference_auctions.experiments.live_plan import LivePlan
from inference_auctions.experiments.live_run import RequestRecord, RunResult
from inference_auctions.server.auction.wait_overlap import overlaps

__all__ = ["WINDOW_SECONDS", "measure", "overlap_welfare", "welfare"]

WINDOW_SECONDS = 2.0


def welfare(records: Sequence[RequestRecord], window: float = WINDOW_SECONDS) -> tuple[int, float]:
    """(welfare in micro-credits, percent above half the values), over arrival windows."""
    windows: dict[int, list[RequestRecord]] = {}
    for record in records:
        windows.setdefault(int(record.sent // window), []).append(record)
    total = 0.0
    half = 0.0
    for members in windows.values():
        n = len(members)
        # First token by the run's clock; a failure after every success.
        ranked = sorted(
            members,
            key=lambda r: (r.ttft is None, r.sent + (r.ttft or 0.0), r.index),
        )
        for place, record in enumerate(ranked):
            priority = 1.0 if n == 1 else (n - 1 - place) / (n - 1)
            if record.ttft is None:
                priority = 0.0
            total += record.value_micros * priority
        half += sum(r.value_micros for r in members) / 2
    percent = 100.0 * (total / half - 1.0) if half else 0.0
    return round(total), percent


def overlap_welfare(records: Sequence[RequestRecord]) -> float:
    """Percent above one half of the value-weighted share of overlapping waits served after
    each request (see the module docstring); failed requests count as served after all. The
    share is the server's tier figure's (`server.auction.wait_overlap`), on first tokens."""
    ordered = sorted(records, key=lambda r: r.sent)
    spans = [(r.sent, r.sent + r.ttft if r.ttft is not None else math.inf) for r in ordered]
    weighted = 0.0
    values = 0.0
    for record, overlap in zip(ordered, overlaps(spans), strict=True):
        if not overlap.competitors:
            continue  # nobody waited beside it: no order to judge
        weighted += record.value_micros * overlap.after / overlap.competitors
        values += record.value_micros
    return 100.0 * (weighted / (values / 2) - 1.0) if values else 0.0


def _percentile_ms(values: list[float], q: float) -> float | None:
    return None if not values else round(1000 * float(np.percentile(values, q)), 1)


def measure(result: RunResult, plan: LivePlan) -> dict[str, Any]:
    """Every measure of the module docstring for one run, as results.json holds it."""
    records = result.records
    served = [r for r in records if r.ttft is not None]
    weights = sum(r.value_micros for r in served)
    weighted_ttft = sum(r.value_micros * (r.ttft or 0.0) for r in served)
    edges = np.quantile([r.value_micros for r in plan.requests], np.linspace(0, 1, 11))
    p50: list[float | None] = []
    p95: list[float | None] = []
    for decile in range(10):
        low, high = edges[decile], edges[decile + 1]
        ttfts = [
            r.ttft or 0.0
            for r in served
            if low <= r.value_micros and (r.value_micros < high or decile == 9)
        ]
        p50.append(_percentile_ms(ttfts, 50))
        p95.append(_percentile_ms(ttfts, 95))
    welfare_micros, welfare_percent = welfare(records)
    prompt = sum(r.prompt_tokens for r in served)
    tiers: dict[str, int] = {}
    for record in records:
        if record.tier is not None:
            tiers[record.tier] = tiers.get(record.tier, 0) + 1
    overspent = sorted(t for t, spent in result.spend.items() if spent > plan.budgets[t])
    # What each class paid for admission against what its requests were worth, and its TTFT.
    by_class: dict[str, dict[str, Any]] = {}
    for kind in sorted(set(plan.kinds.values())):
        mine = [r for r in served if plan.kinds[r.tenant] == kind]
        values = sum(r.value_micros for r in mine)
        by_class[kind] = {
            "served": len(mine),
            "bid_to_value": round(sum(r.bid_micros for r in mine) / values, 4) if values else None,
            "ttft_p50_ms": _percentile_ms([r.ttft or 0.0 for r in mine], 50),
            "spend_micros": sum(s for t, s in result.spend.items() if plan.kinds[t] == kind),
        }
    return {
        "welfare_micros": welfare_micros,
        "welfare_percent": round(welfare_percent, 2),
        "overlap_welfare_percent": round(overlap_welfare(records), 2),
        "last_first_token_s": round(max((r.sent + (r.ttft or 0.0) for r in served), default=0), 2),
        "value_weighted_ttft_ms": round(1000 * weighted_ttft / weights, 1) if weights else None,
        "mean_ttft_ms": _mean_ms([r.ttft or 0.0 for r in served]),
        "revenue_micros": sum(result.spend.values()),
        "ttft_p50_ms_by_value_decile": p50,
        "ttft_p95_ms_by_value_decile": p95,
        "cache_hit_rate": round(sum(r.cached_tokens for r in served) / prompt, 4) if prompt else 0,
        "requests": len(records),
        "requests_served": len(served),
        "requests_failed": len(records) - len(served),
        "overspent_tenants": overspent,
        "spend_micros_by_tenant": dict(sorted(result.spend.items())),
        "requests_by_tier": dict(sorted(tiers.items())),
        "by_class": by_class,
        "tier_prices_micros": result.tier_prices,
        "client_cpu_seconds": round(result.client_cpu_seconds, 2),
        "server_cpu_seconds": round(result.server_cpu_seconds, 2),
        "wall_seconds": round(result.wall_seconds, 1),
        "plan_digest": result.plan_digest,
    }


def _mean_ms(values: list[float]) -> float | None:
    return round(1000 * sum(values) / len(values), 1) if values else None
