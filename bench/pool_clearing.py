"""How long one clearing of a rolling auction takes on the serving path, by pool size.

At every engine opening the server orders the whole waiting pool (`PoolSelector`: the pool's
radix tree brought in step with what joined and left, the average-bid DFS as far as the head,
the shares, the head's charges against the pool), takes the head the engine can start, and
makes it a batch (`clear_head`: its order, charges and own tree).
This script runs exactly those two calls on a pool of --pool paper-scale prompts (mixshare-50:
half the queries in article or few-shot clusters of about 1k shared tokens, values 1 +
Pareto(1.5)) from --users users, then keeps the pool at that size as a server under a steady
backlog would: each clearing sends a head of --head requests (or fewer: up to --prefill-tokens
of prompt), and as many new queries join before the next. It prints the p50, p99 and max
wall-clock milliseconds of a clearing per pool size in that steady state, on this machine, and
apart from them the first clearing, which inserts the whole pool into the tree at once (a
server sees that only when a whole pool arrives between two openings); then, as the reference
measured in the same run, the p50 of the same clearings with the pool's tree built anew every
time (`order_pool`, `rolling_charges`) and how many times the kept tree is faster.

Run: `python -m bench.pool_clearing` (pools of 256, 1,024 and 4,096).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import platform
import time
from collections.abc import Iterator

import numpy as np
from rich.console import Console
from rich.table import Table

from inference_auctions.experiments.workloads import mixshare
from inference_auctions.server.auction import AuctionRequest
from inference_auctions.server.auction.rolling import clear_head, order_pool, rolling_charges
from inference_auctions.server.serving.pool import EngineShares, Wakeup
from inference_auctions.server.serving.selection import PoolSelector
from inference_auctions.server.serving.tickets import Ticket
from inference_auctions.server.settings import ServerSettings


def _queries(seed: int, users: int) -> Iterator[Ticket]:
    """An endless stream of mixshare-50 tickets, in blocks of 1,024 queries."""
    rng = np.random.default_rng(seed)
    made = 0
    while True:
        for query in mixshare(50, 1_024, rng).queries:
            user = f"u{made % users}"
            yield Ticket(
                user=user,
                rid=f"r{made}",
                ledger_rid=f"{user}/r{made}",
                tokens=query.tokens,
                bid_micros=query.value,
                sampling_params={"max_new_tokens": query.max_new_tokens},
                fingerprint="",
            )
            made += 1


def from_scratch(pool_size: int, clearings: int, head: int, users: int) -> list[float]:
    """Milliseconds of the same clearing with the pool's tree built anew each time
    (`order_pool` and `rolling_charges`, the reference the kept tree is tested against)."""
    stream = _queries(seed=pool_size, users=users)
    waiting = [next(stream) for _ in range(pool_size)]
    timings: list[float] = []
    for _ in range(clearings):
        started = time.perf_counter()
        pool = order_pool(
            [AuctionRequest(t.ledger_rid, t.user, t.tokens, t.bid_micros) for t in waiting]
        )
        sent = pool.order[:head]
        rolling_charges(pool, sent, 64)
        timings.append(1000 * (time.perf_counter() - started))
        taken = set(sent)
        waiting = [t for place, t in enumerate(waiting) if place not in taken]
        waiting.extend(next(stream) for _ in sent)
    return timings


def measure(pool_size: int, clearings: int, head: int, prefill: int, users: int) -> list[float]:
    """Milliseconds of each clearing of a pool kept at `pool_size`; the first one, which
    inserts the whole pool into the tree, comes first."""
    settings = ServerSettings(max_inflight=100_000, batch_size=64, engine_tokens=10**12)
    shares = EngineShares(settings, Wakeup())
    select = PoolSelector(settings, shares, lambda: prefill)
    rule = settings.auction_rule()
    stream = _queries(seed=pool_size, users=users)
    waiting = [next(stream) for _ in range(pool_size)]
    timings: list[float] = []
    gc.collect()
    for _ in range(clearings):
        started = time.perf_counter()
        selection = select(waiting, head)
        chosen = [waiting[place] for place in selection.places]
        assert selection.context is not None
        clear_head(
            [AuctionRequest(t.ledger_rid, t.user, t.tokens, t.bid_micros) for t in chosen],
            selection.context,
            rule,
        )
        timings.append(1000 * (time.perf_counter() - started))
        for ticket in chosen:  # the head ends; its shares are given back
            for release in ticket.on_finish:
                release()
        taken = set(selection.places)
        waiting = [t for place, t in enumerate(waiting) if place not in taken]
        waiting.extend(next(stream) for _ in chosen)
    return timings


async def _main(args: argparse.Namespace) -> None:
    table = Table(title=f"One rolling clearing, ms ({platform.processor() or platform.machine()})")
    columns = ("pool", "first (all inserted)", "clearings", "p50", "p99", "max")
    for column in (*columns, "anew p50", "anew / kept"):
        table.add_column(column, justify="right")
    for size in args.pool:
        first, *timings = measure(
            size, args.clearings + 1, args.head, args.prefill_tokens, args.users
        )
        anew = float(np.percentile(from_scratch(size, args.anew, args.head, args.users), 50))
        kept = float(np.percentile(timings, 50))
        table.add_row(
            f"{size:,}",
            f"{first:.1f}",
            str(len(timings)),
            f"{kept:.2f}",
            f"{np.percentile(timings, 99):.2f}",
            f"{max(timings):.2f}",
            f"{anew:.1f}",
            f"{anew / kept:.0f}x",
        )
    Console(width=160).print(table)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pool", type=int, nargs="+", default=[256, 1_024, 4_096])
    parser.add_argument("--clearings", type=int, default=200)
    parser.add_argument(
        "--anew", type=int, default=10, help="clearings with the tree built anew, for the ratio"
    )
    parser.add_argument("--head", type=int, default=8, help="the engine's free slots")
    parser.add_argument("--prefill-tokens", type=int, default=8_192)
    parser.add_argument("--users", type=int, default=64)
    asyncio.run(_main(parser.parse_args()))


if __name__ == "__main__":
    main()
