"""How far the SDK's `auction_outlook` wait estimate is from the wait a request then gets.

Starts `inference-auction serve` with its embedded emulator (a cap of `--running` requests, a
time scale) on a temporary SQLite ledger, and offers it more streamed requests than it can
start (`--load` times its measured start rate), from users bidding values drawn from a Pareto
law. Every `--probe-every` seconds a probe user asks `auction_outlook(value)` and at once sends
the bid it names; its real wait is the time to the stream's first event, which the server sends
when the request is dispatched to the engine.

Two estimates of the same wait are compared with it, both `ahead / starts_per_second`:

* `outlook`: the SDK's own, from the server's `GET /v1/market/pool` (a server without the
  route gives none: the column stays empty);
* `client`: rebuilt here from what the bench itself sent, which is all the traffic: the
  requests waiting with a bid at least the probe's (the prompts are distinct, so the auction
  ranks by bid) over the dispatches of the last two seconds. It says what the formula is worth
  whatever the server publishes; `client, ahead+1` counts the probe's own start too.

Run: `python -m bench.outlook_wait` (about a minute; see --help). Extra `serve` options follow
`--`, e.g. `-- --price-floor posted`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import tempfile
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from rich.console import Console
from rich.table import Table

from bench.serving_processes import Service, free_port, start_service
from inference_auctions.billing import Ledger, migrate
from inference_auctions.sdk import AsyncAuctionClient, Budget, format_credits

_WINDOW = 2.0  # seconds of dispatches the client-side start rate is measured over


@dataclass(frozen=True)
class Plan:
    """The run's settings (see --help)."""

    seconds: float
    warmup: float
    load: float
    running: int
    time_scale: float
    new_tokens: int
    probe_every: float
    users: int
    seed: int
    serve_options: tuple[str, ...]


@dataclass
class Probe:
    """One probe: the estimates before it was sent, and the wait it got."""

    outlook: float | None
    client: float | None
    ahead: int
    rate: float
    real: float | None = None


@dataclass
class Market:
    """The bench's view of its own traffic: who waits with which bid, and recent dispatches."""

    waiting: dict[int, int] = field(default_factory=dict)
    dispatches: deque[float] = field(default_factory=deque)
    sent: int = 0
    served: int = 0
    failed: int = 0

    def starts_per_second(self, now: float) -> float:
        while self.dispatches and self.dispatches[0] < now - _WINDOW:
            self.dispatches.popleft()
        return len(self.dispatches) / _WINDOW

    def ahead(self, bid: int) -> int:
        return sum(1 for other in self.waiting.values() if other >= bid)


def _value(rng: random.Random) -> int:
    """A value in micro-credits: 1,000 x (1 + Lomax(1.5)), capped at 100,000."""
    return int(1_000 * min(100.0, rng.paretovariate(1.5)))


def _words(rng: random.Random, count: int) -> str:
    letters = "abcdefghijklmnopqrstuvwxyz"
    return " ".join("".join(rng.choices(letters, k=5)) for _ in range(count))


async def _send(
    http: httpx.AsyncClient, key: str, bid: int, plan: Plan, market: Market, rng: random.Random
) -> float | None:
    """One streamed request; its wait until dispatch (the first event), None if it failed."""
    number = market.sent
    market.sent += 1
    body = {
        "text": _words(rng, 12),
        "bid": format_credits(bid),
        "stream": True,
        "sampling_params": {"max_new_tokens": plan.new_tokens, "ignore_eos": True},
    }
    started = time.monotonic()
    market.waiting[number] = bid
    wait: float | None = None
    try:
        headers = {"Authorization": f"Bearer {key}"}
        async with http.stream("POST", "/generate", json=body, headers=headers) as response:
            async for line in response.aiter_lines():
                if wait is None and line.startswith("data: {"):
                    now = time.monotonic()
                    wait = now - started
                    market.waiting.pop(number, None)
                    market.dispatches.append(now)
                    if "error" in json.loads(line[6:]):
                        wait = None
                        break
    except httpx.HTTPError:
        wait = None
    market.waiting.pop(number, None)
    if wait is None:
        market.failed += 1
    else:
        market.served += 1
    return wait


async def _probe(
    client: AsyncAuctionClient,
    http: httpx.AsyncClient,
    key: str,
    plan: Plan,
    market: Market,
    rng: random.Random,
) -> Probe:
    value = _value(rng)
    seen = await client.auction_outlook(format_credits(value))
    now = time.monotonic()
    rate = market.starts_per_second(now)
    ahead = market.ahead(seen.bid_micros)
    probe = Probe(
        outlook=seen.expected_wait_seconds,
        client=ahead / rate if rate > 0 else None,
        ahead=ahead,
        rate=rate,
    )
    probe.real = await _send(http, key, seen.bid_micros, plan, market, rng)
    return probe


async def _measure_rate(http: httpx.AsyncClient, keys: list[str], plan: Plan) -> float:
    """The starts per second the engine sustains with a deep pool: a burst, dispatches timed."""
    market = Market()
    rng = random.Random(plan.seed + 1)
    burst = plan.running * 8
    tasks = [
        asyncio.create_task(_send(http, keys[i % len(keys)], _value(rng), plan, market, rng))
        for i in range(burst)
    ]
    started = time.monotonic()
    await asyncio.gather(*tasks)
    return market.served / max(1e-9, time.monotonic() - started)


async def _run(url: str, keys: list[str], probe_key: str, plan: Plan) -> tuple[list[Probe], float]:
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    timeout = httpx.Timeout(600, connect=10)
    async with (
        httpx.AsyncClient(base_url=url, limits=limits, timeout=timeout) as http,
        AsyncAuctionClient(
            url, probe_key, budget=Budget(total="1000000", auctions=10**6, pacing="asap")
        ) as client,
    ):
        capacity = await _measure_rate(http, keys, plan)
        market = Market()
        rng = random.Random(plan.seed)
        gap = 1.0 / (capacity * plan.load)
        tasks: list[asyncio.Task[float | None]] = []
        probes: list[asyncio.Task[Probe]] = []
        started = time.monotonic()
        next_probe = started + plan.warmup
        while (now := time.monotonic()) < started + plan.seconds:
            key = keys[market.sent % len(keys)]
            tasks.append(asyncio.create_task(_send(http, key, _value(rng), plan, market, rng)))
            if now >= next_probe:
                probes.append(
                    asyncio.create_task(_probe(client, http, probe_key, plan, market, rng))
                )
                next_probe += plan.probe_every
            await asyncio.sleep(rng.expovariate(1.0 / gap))
        results = await asyncio.gather(*probes)
        await asyncio.gather(*tasks)
    return list(results), capacity


def _start(folder: Path, plan: Plan) -> tuple[Service, str, str]:
    database_url = f"sqlite:///{folder / 'ledger.db'}"
    port = free_port()
    env = {
        "INFERENCE_AUCTION_RUN_JOBS": "false",
        "INFERENCE_AUCTION_CONNECTION_SHARE_PER_CLIENT": "1",
        "INFERENCE_AUCTION_RATE_LIMIT_PER_SECOND": "100000",
        "INFERENCE_AUCTION_RATE_LIMIT_BURST": "100000",
        "INFERENCE_AUCTION_EMULATOR_TIME_SCALE": str(plan.time_scale),
        "INFERENCE_AUCTION_EMULATOR_MAX_RUNNING_REQUESTS": str(plan.running),
    }
    command = [sys.executable, "-m", "inference_auctions.server.cli", "serve"]
    command += ["--port", str(port), "--database-url", database_url, "--log-level", "warning"]
    url = f"http://127.0.0.1:{port}"
    server = start_service(
        "server",
        [*command, *plan.serve_options],
        url=url,
        health_path="/health",
        log_dir=folder,
        env=env,
    )
    return server, url, database_url


def _users(database_url: str, count: int) -> tuple[list[str], str]:
    migrate.upgrade(database_url)
    ledger = Ledger.from_url(database_url)
    try:
        keys = [ledger.create_user(f"load{i}", budget_micros=10**12).api_key for i in range(count)]
        probe = ledger.create_user("probe", budget_micros=10**12).api_key
    finally:
        ledger.close()
    return keys, probe


def _pairs(probes: Sequence[Probe], pick: str) -> list[tuple[float, float]]:
    """(estimate, real wait) of the probes that have both."""
    pairs = []
    for probe in probes:
        estimate = {
            "outlook": probe.outlook,
            "client": probe.client,
            # The same with the probe's own start counted: it waits for an opening too.
            "client, ahead+1": (probe.ahead + 1) / probe.rate if probe.rate > 0 else None,
        }[pick]
        if estimate is not None and probe.real is not None:
            pairs.append((estimate, probe.real))
    return pairs


def table(probes: list[Probe]) -> Table:
    """Estimate minus real wait, in milliseconds, for each estimate."""
    out = Table(
        "estimate", "probes", "n", "mean error", "median error", "p90 |error|", "mean |rel|"
    )
    groups = {
        "all": probes,
        "none ahead": [p for p in probes if p.ahead == 0],
        "some ahead": [p for p in probes if p.ahead > 0],
    }
    for pick in ("outlook", "client", "client, ahead+1"):
        for name, group in groups.items():
            _row(out, pick, name, _pairs(group, pick))
    return out


def _row(out: Table, pick: str, name: str, pairs: list[tuple[float, float]]) -> None:
    if not pairs:
        out.add_row(pick, name, "0", "-", "-", "-", "-")
    else:
        errors = [estimate - real for estimate, real in pairs]
        absolute = sorted(abs(e) for e in errors)
        relative = [abs(estimate - real) / real for estimate, real in pairs if real > 0]
        out.add_row(
            pick,
            name,
            str(len(pairs)),
            f"{statistics.fmean(errors) * 1000:+.0f} ms",
            f"{statistics.median(errors) * 1000:+.0f} ms",
            f"{absolute[int(0.9 * (len(absolute) - 1))] * 1000:.0f} ms",
            f"{statistics.fmean(relative):.2f}" if relative else "-",
        )


def _arguments(argv: Sequence[str] | None) -> Plan:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=40.0, help="load phase (wall seconds)")
    parser.add_argument("--warmup", type=float, default=8.0, help="before the first probe")
    parser.add_argument("--load", type=float, default=1.2, help="offered over measured starts")
    parser.add_argument("--running", type=int, default=8, help="the emulator's running cap")
    parser.add_argument("--time-scale", type=float, default=0.2, help="emulator wall/model")
    parser.add_argument("--new-tokens", type=int, default=32, help="tokens per answer")
    parser.add_argument("--probe-every", type=float, default=0.5, help="seconds between probes")
    parser.add_argument("--users", type=int, default=16, help="load users")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("serve_options", nargs="*", help="extra `serve` options, after --")
    args = parser.parse_args(argv)
    return Plan(
        seconds=args.seconds,
        warmup=args.warmup,
        load=args.load,
        running=args.running,
        time_scale=args.time_scale,
        new_tokens=args.new_tokens,
        probe_every=args.probe_every,
        users=args.users,
        seed=args.seed,
        serve_options=tuple(args.serve_options),
    )


def run(plan: Plan, folder: Path) -> tuple[list[Probe], float]:
    """A server in `folder`, the load and the probes: the probes and the measured start rate."""
    server, url, database_url = _start(folder, plan)
    try:
        keys, probe_key = _users(database_url, plan.users)
        return asyncio.run(_run(url, keys, probe_key, plan))
    finally:
        server.stop()


def main(argv: Sequence[str] | None = None) -> None:
    plan = _arguments(argv)
    console = Console(width=110)
    with tempfile.TemporaryDirectory(prefix="outlook-wait-") as tmp:
        probes, capacity = run(plan, Path(tmp))
    waits = [p.real for p in probes if p.real is not None]
    console.print(
        f"engine starts {capacity:.1f}/s measured, offered {plan.load:.2f}x; "
        f"{len(probes)} probes, real wait median {statistics.median(waits) * 1000:.0f} ms, "
        f"p90 {sorted(waits)[int(0.9 * (len(waits) - 1))] * 1000:.0f} ms; "
        f"entrants ahead median {statistics.median(p.ahead for p in probes):.0f}"
    )
    console.print(table(probes))


if __name__ == "__main__":
    main()
