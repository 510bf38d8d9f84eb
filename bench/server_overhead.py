"""What the auction layer adds to each request, under load.

Starts `inference-auction serve` in its own process (embedded engine, an SQLite ledger in a
temporary folder, or --database-url), drives it with C concurrent clients of U users for S
seconds each, and prints per load level: requests served, throughput, the auction layer's
overhead (arrival to dispatch minus the batching wait: authentication, hold, auction,
settlement, dispatch), the batching wait, and the engine's own time to first token, which is
the reference the overhead is compared with (the last column is their ratio).

Run: `python -m bench.server_overhead` (see --help).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from inference_auctions.billing import Ledger, migrate


@dataclass
class Level:
    """The results of one load level."""

    clients: int
    requests: int
    seconds: float
    overhead_p50: float
    overhead_p99: float
    wait_p50: float
    ttft_p50: float


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _start_server(url: str, port: int, extra_env: dict[str, str]) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "INFERENCE_AUCTION_DATABASE_URL": url,
        "INFERENCE_AUCTION_PORT": str(port),
        "INFERENCE_AUCTION_RATE_LIMIT_PER_SECOND": "100000",
        "INFERENCE_AUCTION_RATE_LIMIT_BURST": "100000",
        **extra_env,
    }
    command = [
        sys.executable,
        "-m",
        "inference_auctions.server.cli",
        "serve",
        "--log-level",
        "warning",
    ]
    process = subprocess.Popen(
        command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    deadline = time.monotonic() + 60
    while True:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return process
        except httpx.TransportError:
            pass
        if process.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError("the server did not start")
        time.sleep(0.2)


async def _drive(base: str, keys: list[str], clients: int, seconds: float) -> list[float]:
    """Send requests from `clients` loops until time is up; returns engine TTFTs (s)."""
    ttfts: list[float] = []
    articles = [f"Article {a}: " + " ".join(f"w{a}x{i}" for i in range(300)) for a in range(16)]

    async def loop(index: int) -> None:
        rng = random.Random(index)
        headers = {"Authorization": f"Bearer {keys[index % len(keys)]}"}
        deadline = time.monotonic() + seconds
        async with httpx.AsyncClient(base_url=base, headers=headers, timeout=300) as http:
            while time.monotonic() < deadline:
                body = {
                    "text": rng.choice(articles) + f" Question {index}-{rng.random()}?",
                    "bid": f"{rng.random():.6f}",
                    "sampling_params": {"max_new_tokens": 8},
                }
                reply = await http.post("/generate", json=body)
                reply.raise_for_status()
                ttfts.append(float(reply.json()["meta_info"].get("first_token_latency", 0.0)))

    await asyncio.gather(*(loop(i) for i in range(clients)))
    return ttfts


def run(
    levels: Sequence[int], users: int, seconds: float, database_url: str | None, env: dict[str, str]
) -> list[Level]:
    """Measure every load level against one fresh server each."""
    results: list[Level] = []
    with tempfile.TemporaryDirectory() as folder, Progress(transient=True) as progress:
        task = progress.add_task("load levels", total=len(levels))
        for clients in levels:
            url = database_url or f"sqlite:///{Path(folder) / f'ledger-{clients}.db'}"
            migrate.upgrade(url)
            ledger = Ledger.from_url(url)
            tag = f"{clients}-{time.time_ns()}"
            keys = [
                ledger.create_user(f"load{u}-{tag}", budget_micros=10**15).api_key
                for u in range(users)
            ]
            admin = ledger.create_user(f"admin-{tag}", budget_micros=0, admin=True).api_key
            ledger.close()
            port = _free_port()
            server = _start_server(url, port, env)
            try:
                base = f"http://127.0.0.1:{port}"
                started = time.monotonic()
                ttfts = asyncio.run(_drive(base, keys, clients, seconds))
                elapsed = time.monotonic() - started
                stats: dict[str, Any] = httpx.get(
                    base + "/v1/admin/timings", headers={"Authorization": f"Bearer {admin}"}
                ).json()
            finally:
                server.terminate()
                server.wait(60)
            results.append(
                Level(
                    clients=clients,
                    requests=len(ttfts),
                    seconds=elapsed,
                    overhead_p50=stats["overhead"]["p50_ms"],
                    overhead_p99=stats["overhead"]["p99_ms"],
                    wait_p50=stats["batching_wait"]["p50_ms"],
                    ttft_p50=statistics.median(ttfts) * 1000,
                )
            )
            progress.advance(task)
    return results


def _table(results: list[Level]) -> Table:
    table = Table(title="Auction layer overhead under load (embedded engine)")
    for column in (
        "clients",
        "requests",
        "req/s",
        "overhead p50 ms",
        "overhead p99 ms",
        "batching wait p50 ms",
        "engine TTFT p50 ms",
        "overhead p50 / TTFT p50",
    ):
        table.add_column(column, justify="right")
    for r in results:
        table.add_row(
            str(r.clients),
            str(r.requests),
            f"{r.requests / r.seconds:.0f}",
            f"{r.overhead_p50:.1f}",
            f"{r.overhead_p99:.1f}",
            f"{r.wait_p50:.1f}",
            f"{r.ttft_p50:.1f}",
            f"{r.overhead_p50 / r.ttft_p50:.2f}" if r.ttft_p50 else "-",
        )
    return table


def main(argv: Sequence[str] | None = None) -> None:
    """Run the benchmark and print its table."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--clients", type=int, nargs="+", default=[20, 200], help="load levels")
    parser.add_argument("--users", type=int, default=20)
    parser.add_argument("--seconds", type=float, default=10.0, help="per load level")
    parser.add_argument("--database-url", help="ledger (default: a temporary SQLite file)")
    parser.add_argument("--time-scale", default="0.01", help="emulator seconds per model second")
    parser.add_argument("--batch-size", default="64")
    parser.add_argument("--max-inflight", default="128")
    args = parser.parse_args(argv)
    env = {
        "INFERENCE_AUCTION_EMULATOR_TIME_SCALE": args.time_scale,
        "INFERENCE_AUCTION_BATCH_SIZE": args.batch_size,
        "INFERENCE_AUCTION_MAX_INFLIGHT": args.max_inflight,
    }
    results = run(args.clients, args.users, args.seconds, args.database_url, env)
    Console().print(_table(results))


if __name__ == "__main__":
    main()
