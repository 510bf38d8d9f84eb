"""Latency at one connection: through the auction server against straight to the engine.

Starts `emulate-sglang` in its own process and `inference-auction serve` in front of it (an
SQLite ledger in a temporary folder), then sends N sequential requests straight to the
emulator and N through the auction server, and prints each path's p50 and p99. With nothing to
compete with, the difference is what the layer adds; a batching policy that waits for company
shows up here as its whole window. `--policy engine-fed` reproduces the policy before
work-conserving batching (a 50 ms window; the engine is saturated only at `max_inflight`).

Run: `python -m bench.single_connection` (see --help).
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

from inference_auctions.billing import Ledger, migrate
from tests.processes import free_port, wait_until_healthy

POLICIES: dict[str, dict[str, str]] = {
    "work-conserving": {},
    "engine-fed": {
        "INFERENCE_AUCTION_MAX_WAIT_MS": "50",
        "INFERENCE_AUCTION_SATURATION_TOKENS": str(10**9),
        "INFERENCE_AUCTION_SATURATION_REQUESTS": str(10**9),
    },
}


def _start(command: list[str], env: dict[str, str], url: str) -> subprocess.Popen[bytes]:
    process = subprocess.Popen(
        command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    wait_until_healthy(url, process, timeout=60)
    return process


def _latencies(client: httpx.Client, bodies: list[dict[str, Any]]) -> list[float]:
    """Seconds per request, sent one after the other."""
    seconds = []
    for body in bodies:
        started = time.perf_counter()
        reply = client.post("/generate", json=body)
        reply.raise_for_status()
        seconds.append(time.perf_counter() - started)
    return seconds


def _bodies(count: int, seed: int, bid: str | None) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    bodies: list[dict[str, Any]] = []
    for _ in range(count):
        body: dict[str, Any] = {
            "input_ids": [rng.randrange(1, 30_000) for _ in range(64)],
            "sampling_params": {"max_new_tokens": 4},
        }
        if bid is not None:
            body["bid"] = bid
        bodies.append(body)
    return bodies


def _summary(seconds: list[float]) -> str:
    ms = sorted(s * 1000 for s in seconds)
    p99 = ms[min(len(ms) - 1, int(len(ms) * 0.99))]
    return f"p50 {statistics.median(ms):7.2f} ms   p99 {p99:7.2f} ms"


def run(policy: str, requests: int, time_scale: float) -> None:
    """Measure both paths with one emulator and one auction server."""
    with tempfile.TemporaryDirectory() as folder:
        database = f"sqlite:///{Path(folder) / 'ledger.db'}"
        migrate.upgrade(database)
        ledger = Ledger.from_url(database)
        key = ledger.create_user("solo", budget_micros=10**15).api_key
        admin = ledger.create_user("admin", budget_micros=0, admin=True).api_key
        ledger.close()
        cli = [sys.executable, "-m", "inference_auctions.server.cli"]
        engine_port, server_port = free_port(), free_port()
        engine_url = f"http://127.0.0.1:{engine_port}"
        server_url = f"http://127.0.0.1:{server_port}"
        emulator = _start(
            [*cli, "emulate-sglang", "--port", str(engine_port), "--time-scale", str(time_scale)],
            dict(os.environ),
            engine_url,
        )
        env = {
            **os.environ,
            "INFERENCE_AUCTION_DATABASE_URL": database,
            "INFERENCE_AUCTION_PORT": str(server_port),
            "INFERENCE_AUCTION_ENGINE_URL": engine_url,
            "INFERENCE_AUCTION_RUN_JOBS": "false",
            **POLICIES[policy],
        }
        server = _start([*cli, "serve", "--log-level", "warning"], env, server_url)
        try:
            headers = {"Authorization": f"Bearer {key}"}
            with (
                httpx.Client(base_url=engine_url, timeout=60) as direct,
                httpx.Client(base_url=server_url, headers=headers, timeout=60) as layer,
            ):
                _latencies(direct, _bodies(20, 1, None))  # warm-up
                _latencies(layer, _bodies(20, 2, "0.01"))
                straight = _latencies(direct, _bodies(requests, 3, None))
                through = _latencies(layer, _bodies(requests, 4, "0.01"))
                timings = httpx.get(
                    server_url + "/v1/admin/timings", headers={"Authorization": f"Bearer {admin}"}
                ).json()
        finally:
            for process in (server, emulator):
                process.terminate()
                process.wait(30)
    print(f"policy {policy}, {requests} sequential requests each, time scale {time_scale:g}")
    print(f"  straight to the emulator:    {_summary(straight)}")
    print(f"  through the auction server:  {_summary(through)}")
    wait, overhead = timings["batching_wait"]["p50_ms"], timings["overhead"]["p50_ms"]
    print(f"  the server's own view, p50:  batching wait {wait} ms, overhead {overhead} ms")
    print(
        "  difference at p50:           "
        f"{(statistics.median(through) - statistics.median(straight)) * 1000:.2f} ms"
    )


def main(argv: Sequence[str] | None = None) -> None:
    """Parse the options and measure."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--policy", choices=sorted(POLICIES), default="work-conserving")
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--time-scale", type=float, default=0.001)
    args = parser.parse_args(argv)
    run(args.policy, args.requests, args.time_scale)


if __name__ == "__main__":
    main()
