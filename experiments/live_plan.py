"""The live market experiment's plan: tenants, their arrivals, values and budgets, the engine's
capacity and the tiers' prices. Pure and seeded: the four runs (`fcfs`, `tiers2`, `tiers3`,
`auction`) are handed the same plan, so they see the same arrivals and values.

The laws (docs/RESULTS.md, "The market, live"):

* tenants: `interactive` (high values, short answers, each with a system prompt of its own),
  `batch` (low values, longer answers over a shared document), `heavy` (middling values, three
  times the others' request rate); within a class every tenant sends at the same rate;
* a request's value is `scale x (1 + Lomax(1.5))` micro-credits (the paper's law), `scale` its
  class's;
* arrivals are Poisson over `seconds`, at `load` (1.5) times the engine's capacity in all,
  capacity being the requests per second the emulated engine completes when saturated with
  the same requests (`engine_capacity`);
* a tenant's budget is `budget_share` (a quarter) of the sum of the values it will send,
  paced over its number of requests;
* `tiersN` prices: the free tier at 0, and each step up costs `q(j/N) / N`, `q` the quantile
  of the run's values: at an even split of the batch by tier (the priority a tier buys before
  any traffic), a request of value `q(j/N)` gains as much from tier `j` as from tier `j-1`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from inference_auctions.server.emulator.simulator import EngineSimulator, SimRequest
from inference_auctions.server.engine.builtin_tokenizer import encode

__all__ = [
    "CLASSES",
    "LivePlan",
    "PlannedRequest",
    "TenantClass",
    "engine_capacity",
    "make_plan",
    "tier_prices",
]

PARETO_SHAPE = 1.5


@dataclass(frozen=True, slots=True)
class TenantClass:
    """A kind of tenant: how many, what its requests are worth and look like, how often."""

    name: str
    tenants: int
    value_scale_micros: int
    rate_weight: float  # each tenant's share of the arrivals, relative to the others'
    output_tokens: int
    prefix_words: int  # the prompt every request of the tenant (or class) starts with
    shared_prefix: bool  # one prefix for the whole class (a shared document) or one each


CLASSES = (
    TenantClass("interactive", 4, 2_000, 1.0, 24, 150, shared_prefix=False),
    TenantClass("batch", 6, 100, 1.0, 96, 400, shared_prefix=True),
    TenantClass("heavy", 2, 500, 3.0, 48, 250, shared_prefix=False),
)


@dataclass(frozen=True, slots=True)
class PlannedRequest:
    """One request of the plan: who sends it, when (seconds from the start), what it is worth
    and what it asks."""

    index: int
    tenant: str
    kind: str
    at: float
    value_micros: int
    prompt: str
    max_new_tokens: int


@dataclass(frozen=True, slots=True)
class LivePlan:
    """Everything the four runs share."""

    seed: int
    seconds: float
    load: float
    capacity_rps: float
    requests: tuple[PlannedRequest, ...]
    budgets: dict[str, int]  # tenant -> micro-credits over the run
    kinds: dict[str, str]  # tenant -> its class
    budget_share: float

    def tenant_requests(self, tenant: str) -> list[PlannedRequest]:
        """The tenant's requests, in time order."""
        return [r for r in self.requests if r.tenant == tenant]


def _words(rng: np.random.Generator, count: int, tag: str) -> str:
    return " ".join(f"{tag}{int(w)}" for w in rng.integers(0, 5_000, size=count))


def _prefixes(rng: np.random.Generator, scale: float) -> dict[str, str]:
    """tenant -> the prompt prefix its requests share."""
    prefixes: dict[str, str] = {}
    for kind in CLASSES:
        words = max(1, round(kind.prefix_words * scale))
        shared = _words(rng, words, "doc")
        for number in range(kind.tenants):
            name = f"{kind.name}-{number}"
            prefixes[name] = shared if kind.shared_prefix else _words(rng, words, "s")
    return prefixes


def _draft(
    seed: int, seconds: float, rate: float, prompt_scale: float = 1.0
) -> tuple[list[PlannedRequest], dict[str, str]]:
    """Arrivals, values and prompts at `rate` requests per second in all; prompts' words
    scaled by `prompt_scale` (a small model's context holds fewer)."""
    rng = np.random.default_rng(seed)
    prefixes = _prefixes(rng, prompt_scale)
    weights = {f"{k.name}-{n}": k.rate_weight for k in CLASSES for n in range(k.tenants)}
    kinds = {f"{k.name}-{n}": k for k in CLASSES for n in range(k.tenants)}
    total_weight = sum(weights.values())
    drafted: list[tuple[float, str, int, str, int]] = []
    for tenant, weight in weights.items():
        kind = kinds[tenant]
        tenant_rate = rate * weight / total_weight
        at = float(rng.exponential(1 / tenant_rate))
        while at < seconds:
            value = round(kind.value_scale_micros * (1 + float(rng.pareto(PARETO_SHAPE))))
            question = _words(rng, 12, "q")
            drafted.append((at, tenant, value, f"{prefixes[tenant]} {question}?", 0))
            at += float(rng.exponential(1 / tenant_rate))
    drafted.sort()
    requests = [
        PlannedRequest(
            index=index,
            tenant=tenant,
            kind=kinds[tenant].name,
            at=round(at, 6),
            value_micros=value,
            prompt=prompt,
            max_new_tokens=kinds[tenant].output_tokens,
        )
        for index, (at, tenant, value, prompt, _) in enumerate(drafted)
    ]
    return requests, {tenant: kind.name for tenant, kind in kinds.items()}


def engine_capacity(
    requests: Sequence[PlannedRequest], max_running_requests: int, cache_tokens: int
) -> float:
    """Requests per second the emulated engine completes when all of `requests` wait at once
    (the H100 cost model, in model seconds, which the live runs play at real time)."""
    simulator = EngineSimulator(
        cache_tokens=cache_tokens, max_running_requests=max_running_requests
    )
    outcomes = simulator.run_batch(
        SimRequest(str(r.index), encode(r.prompt), r.max_new_tokens) for r in requests
    )
    finished = max(o.finished_at or 0.0 for o in outcomes)
    return len(outcomes) / finished


def make_plan(
    seed: int,
    seconds: float,
    *,
    load: float = 1.5,
    max_running_requests: int,
    cache_tokens: int,
    budget_share: float = 0.25,
    prompt_scale: float = 1.0,
    capacity: Callable[[list[PlannedRequest]], float] | None = None,
) -> LivePlan:
    """The plan of the module docstring: capacity measured on a sample of the same requests
    (by `capacity`, else on the emulator's cost model), then arrivals at `load` times it."""
    sample, _ = _draft(seed + 1, 60.0, 4.0, prompt_scale)  # the same laws, for the capacity
    if capacity is None:
        rate = engine_capacity(sample[:200], max_running_requests, cache_tokens)
    else:  # a real engine's burst takes real time: a smaller sample
        rate = capacity(sample[:40])
    requests, kinds = _draft(seed, seconds, load * rate, prompt_scale)
    sums: dict[str, int] = dict.fromkeys(kinds, 0)
    for request in requests:
        sums[request.tenant] += request.value_micros
    budgets = {tenant: int(total * budget_share) for tenant, total in sums.items()}
    return LivePlan(
        seed=seed,
        seconds=seconds,
        load=load,
        capacity_rps=rate,
        requests=tuple(requests),
        budgets=budgets,
        kinds=kinds,
        budget_share=budget_share,
    )


def tier_prices(values: Sequence[int], count: int) -> list[int]:
    """The prices of `count` tiers, cheapest first, by the quantile rule of the docstring."""
    ordered = np.sort(np.asarray(values, dtype=np.int64))
    prices = [0]
    for step in range(1, count):
        quantile = int(np.quantile(ordered, step / count, method="lower"))
        prices.append(prices[-1] + max(1, quantile // count))
    return prices
