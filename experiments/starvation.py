"""Starvation inside a subtree: a valuable request under a large shared prefix whose average
bid is low, in the slot model (`experiments.timing_model`), cleared by the server's code.

The average-bid DFS keeps every prefix's requests together and files the prefix by their
average. In one batch that bounds the valuable request's wait (the batch ends); in a rolling
pool, subtrees of a higher average that keep arriving overtake the whole low subtree at every
clearing, and the valuable request with it, for as long as they arrive.

The workload (values anti-correlated with subtree size): a shared document with `LOW` requests
bidding 100 micro-credits and one bidding 5,000 under it, then a stream of small subtrees (1 to
3 requests under a fresh prefix, values `300 x (1 + Pareto(1.5))`) at `load` times the engine's
starts, for `STREAM` slots. Requests wait on (no withdrawal): the point is how long.

The fix measured (`cached`): DFS contiguity only for prefixes not already in the engine's cache.
A request under a cached prefix is filed in the auction's tree without it (the prefix costs no
prefill, so keeping its requests together buys nothing), and competes on its own subtree's
average. The document here was served just before the run, so it is cached.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from inference_auctions.experiments.timing_model import (
    MarketConfig,
    SlotMarket,
    SlotRequest,
    by_slot,
    fresh_tokens,
)
from inference_auctions.server.auction.batch import TokenArray

__all__ = ["StarvationRow", "measure", "starvation_table", "workload"]

LOW = 40
VALUABLE = 5_000
STREAM = 100
_DOC = 1 << 41  # token ids of the document, its questions, the stream and the cache markers


@dataclass(frozen=True, slots=True)
class StarvationRow:
    """The valuable request's wait, and everyone's welfare, under one order at one load."""

    load: float
    fix: bool
    wait: int | None  # slots from its arrival to its start; None: not started in the run
    welfare: float  # value for delay, percent of all value (K-1 positions as in the study)
    stream_delay: float  # the stream's mean delay in positions


def workload(seed: int, load: float, starts: int) -> tuple[list[SlotRequest], TokenArray]:
    """The document's requests, the valuable one, and the stream; and the document's prefix."""
    rng = np.random.default_rng(seed)
    doc = fresh_tokens(_DOC, 400)
    requests = [
        SlotRequest(f"doc-{n}", "doc", np.concatenate([doc, _question(n)]), 100, 100, 0, 0)
        for n in range(LOW)
    ]
    question = np.concatenate([doc, _question(LOW)])
    requests.append(SlotRequest("valuable", "valuable", question, VALUABLE, VALUABLE, 1, 1))
    groups = 0
    for slot in range(STREAM):
        arriving = int(rng.poisson(load * starts))
        while arriving > 0:
            size = min(arriving, int(rng.integers(1, 4)))
            prefix = fresh_tokens(_DOC + 10_000 + 200 * groups, 150)
            for member in range(size):
                value = round(300 * (1 + float(rng.pareto(1.5))))
                tokens = np.concatenate([prefix, _question(100_000 + 4 * groups + member)])
                requests.append(
                    SlotRequest(
                        f"s{groups}-{member}", f"s{groups}", tokens, value, value, slot, slot
                    )
                )
            groups += 1
            arriving -= size
    return requests, doc


def _question(number: int) -> TokenArray:
    return fresh_tokens(_DOC + 1_000 + 8 * number, 8)


def measure(
    seed: int, load: float, *, fix: bool, starts: int = 8, slots: int = 64
) -> StarvationRow:
    """Run the workload to its end under the rolling auction, with or without the fix."""
    requests, doc = workload(seed, load, starts)
    filed: dict[str, TokenArray] = {}
    if fix:  # the document is cached: its requests are filed without it
        for number, request in enumerate(requests):
            if len(request.tokens) > len(doc) and np.array_equal(request.tokens[: len(doc)], doc):
                marker = fresh_tokens(_DOC + 5_000 + number, 1)
                filed[request.rid] = np.concatenate([marker, request.tokens[len(doc) :]])
    config = MarketConfig(starts, slots, floor_target=2 * starts, expire=False)
    run = SlotMarket(config, "dispatch", by_slot(requests), tree_tokens=filed, priced=set())
    end = STREAM + len(requests) // starts + 2
    run.run(0, end)
    valuable = requests[LOW]
    sent = run.dispatched.get(valuable.rid)
    worth = 0
    stream = []
    for request in requests:
        got = run.dispatched.get(request.rid)
        if got is None:
            continue
        delay = got.delay(request, starts)
        worth += request.value * max(0, slots - 1 - delay)
        if request.user.startswith("s"):
            stream.append(delay)
    total = sum(r.value for r in requests) * (slots - 1)
    return StarvationRow(
        load=load,
        fix=fix,
        wait=None if sent is None else sent.slot - valuable.arrival,
        welfare=100 * worth / total,
        stream_delay=float(np.mean(stream)) if stream else 0.0,
    )


def starvation_table(seed: int, loads: tuple[float, ...] = (0.9, 1.0, 1.2, 1.5)) -> str:
    """The markdown table of the module docstring's workload, with and without the fix."""
    lines = [
        "| load of the stream | order | valuable request's wait (slots) | welfare | "
        "stream's mean delay (positions) |",
        "|---|---|---|---|---|",
    ]
    for load in loads:
        for fix in (False, True):
            row = measure(seed, load, fix=fix)
            wait = "not started while the stream lasts" if row.wait is None else str(row.wait)
            if row.wait is not None and row.wait >= STREAM:
                wait = f"{row.wait} (after the stream ends at {STREAM})"
            order = "cached prefixes filed apart" if fix else "rolling auction (now)"
            lines.append(
                f"| {load:g}x | {order} | {wait} | {row.welfare:.1f}% | {row.stream_delay:.1f} |"
            )
    return "\n".join(lines)
