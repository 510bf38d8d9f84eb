"""Does a flood of huge bodies slow down everybody else? Another user's latency, with and without.

Starts `inference-auction serve` in its own process (embedded engine, an SQLite ledger in a
temporary folder), then measures one ordinary user's `/generate` latency, one request after
another: first on an idle server, then while another process keeps eight 10 MB bodies in
flight at all times (`logit_bias` with a million entries and `custom_params` with a million
numbers, each refused with a 400). Prints p50, p99 and max of both, and their ratio; the server
should keep p99 under load within 2x of p99 unloaded.

Run: `python -m bench.hostile_bodies` (see --help).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing
import os
import queue
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx

from inference_auctions.billing import Ledger, migrate

HOSTILE_BYTES = 10 * 1024 * 1024


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _start_server(url: str, port: int) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "INFERENCE_AUCTION_DATABASE_URL": url,
        "INFERENCE_AUCTION_PORT": str(port),
        "INFERENCE_AUCTION_RUN_JOBS": "false",
    }
    command = [
        sys.executable,
        "-m",
        "inference_auctions.server.cli",
        "serve",
    ]
    process = subprocess.Popen(
        [*command, "--log-level", "warning"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
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


def hostile_bodies() -> list[bytes]:
    """A 10 MB `logit_bias` body and a 10 MB `custom_params` body."""
    entries = HOSTILE_BYTES // 12
    bias = ", ".join(f'"{i}": 0.5' for i in range(entries))
    numbers = ", ".join("0.25" for _ in range(HOSTILE_BYTES // 6))
    return [
        f'{{"text": "x", "sampling_params": {{"logit_bias": {{{bias}}}}}}}'.encode(),
        f'{{"text": "x", "sampling_params": {{"custom_params": {{"k": [{numbers}]}}}}}}'.encode(),
    ]


def _flood(base: str, key: str, senders: int, stop: Any, statuses: Any) -> None:
    """Keep `senders` hostile bodies in flight until `stop` is set (runs in its own process);
    puts the status of every answer on `statuses`."""
    bodies = hostile_bodies()

    def send(index: int) -> None:
        body = bodies[index % len(bodies)]
        headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
        with httpx.Client(base_url=base, headers=headers, timeout=300) as http:
            while not stop.is_set():
                statuses.put(http.post("/generate", content=body).status_code)

    threads = [threading.Thread(target=send, args=(i,), daemon=True) for i in range(senders)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def latencies(base: str, key: str, count: int) -> list[float]:
    """Seconds per ordinary `/generate` request, sent one after another."""
    seconds = []
    headers = {"Authorization": f"Bearer {key}"}
    with httpx.Client(base_url=base, headers=headers, timeout=300) as http:
        for index in range(count):
            body = {
                "text": f"An ordinary question, number {index}?",
                "bid": "0.01",
                "sampling_params": {"max_new_tokens": 8},
            }
            started = time.perf_counter()
            reply = http.post("/generate", json=body)
            seconds.append(time.perf_counter() - started)
            reply.raise_for_status()
    return seconds


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time of one process (not its children), from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _summary(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    return {"p50": statistics.median(ordered), "p99": p99, "max": ordered[-1]}


def main() -> None:
    """Measure and print the two latency distributions."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=60, help="ordinary requests per phase")
    parser.add_argument("--senders", type=int, default=8, help="hostile bodies in flight")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        url = f"sqlite:///{Path(folder) / 'ledger.db'}"
        migrate.upgrade(url)
        ledger = Ledger.from_url(url)
        user = ledger.create_user("ordinary", budget_micros=10**12).api_key
        mallory = ledger.create_user("mallory", budget_micros=10**12).api_key
        ledger.close()
        port = _free_port()
        server = _start_server(url, port)
        base = f"http://127.0.0.1:{port}"
        try:
            latencies(base, user, 5)  # warm up
            cpu_before = cpu_seconds(server.pid)
            idle = _summary(latencies(base, user, args.requests))
            cpu_idle = cpu_seconds(server.pid) - cpu_before
            context = multiprocessing.get_context("spawn")
            stop, statuses = context.Event(), context.Queue()
            flood = context.Process(
                target=_flood, args=(base, mallory, args.senders, stop, statuses)
            )
            flood.start()
            time.sleep(3)  # the bodies are built and the first ones are on the wire
            cpu_before = cpu_seconds(server.pid)
            loaded = _summary(latencies(base, user, args.requests))
            cpu_used = cpu_seconds(server.pid) - cpu_before
            stop.set()
            answers: Counter[int] = Counter()
            while flood.is_alive() or not statuses.empty():
                with contextlib.suppress(queue.Empty):
                    answers[statuses.get(timeout=1)] += 1
            flood.join(120)
        finally:
            server.terminate()
            server.wait(30)
    report = {
        "idle": idle,
        "under_flood": loaded,
        "p99_ratio": loaded["p99"] / idle["p99"],
        "hostile_answers": dict(answers),
        "server_main_process_cpu_seconds": {"idle": cpu_idle, "under_flood": cpu_used},
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
