"""What the auction server adds to a lone request, and to a busy engine's throughput, against
going to the same engine directly.

    python -m bench.lone_request --engine sglang --pairs 200 --clients 32

starts the engine (the real SGLang 0.5.23 on this CPU, `make sglang-env`, or the emulator),
then `inference-auction serve --engine-url` in front of it over a fresh ledger, with the
engine's own model and tokenizer learnt (`--tokenizer auto`, the default). Then:

* **Lone requests**: `--pairs` pairs, each one request straight to the engine and the same
  request through the server, one at a time on an idle engine, in alternating order (direct
  first in even pairs, the server first in odd ones), so that a drift of the machine's speed
  falls on both alike. Text (`/v1/completions`) and chat (`/v1/chat/completions`), with
  `max_tokens` 4 and a prompt new to the engine in every pair. Per kind: the median and the
  90th percentile of the per-pair difference (server less direct), and each side's median.
  Through the server every request bids (a paying request: the ledger holds and settles it).
* **Throughput**: `--clients` closed-loop clients for `--seconds`, direct, then through the
  server, then direct again (the direct figure is the mean of the two, so that the machine's
  drift over the run does not favour one side); requests per second and the ratio.

The server's own account of where a request's time went (`GET /v1/admin/timings`) is printed
last. Speed is measured here, not asserted: the figures go to docs/PERFORMANCE.md.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console
from rich.progress import Progress

from bench.serving_ledger import (
    add_postgres_option,
    create_users,
    fresh_database,
)
from bench.serving_processes import Service, free_port, start_service, tree_cpu_seconds
from bench.sglang_cpu.launcher import SGLangServer

_CLI = [sys.executable, "-m", "inference_auctions.server.cli"]
_BID = "0.000500"
_MAX_TOKENS = 4


@dataclass(frozen=True)
class PairFigures:
    """One kind of request, over every pair: milliseconds."""

    kind: str
    pairs: int
    direct_p50: float
    front_p50: float
    added_p50: float
    added_p90: float


@dataclass(frozen=True)
class ThroughputFigures:
    """Closed-loop requests per second, direct (the mean of the runs before and after) and
    through the server, and the CPU each process tree spent per request through the server
    (milliseconds): on a machine of few cores the server's CPU is taken from the engine's."""

    clients: int
    direct_rps: float
    front_rps: float
    server_cpu_ms: float = 0.0
    engine_cpu_ms: float = 0.0
    engine_direct_cpu_ms: float = 0.0  # the engine's, per request, going direct

    @property
    def ratio(self) -> float:
        return self.front_rps / self.direct_rps if self.direct_rps else 0.0


def _body(kind: str, number: int, model: str) -> dict[str, Any]:
    # A prompt new to the engine each time: a cached prompt would time the cache, not us.
    text = f"Request {number}: name one river of country {number * 7919 % 1000}."
    if kind == "chat":
        return {
            "model": model,
            "messages": [{"role": "user", "content": text}],
            "max_tokens": _MAX_TOKENS,
            "temperature": 0,
        }
    return {"model": model, "prompt": text, "max_tokens": _MAX_TOKENS, "temperature": 0}


def _nothing() -> None:
    pass


def _path(kind: str) -> str:
    return "/v1/chat/completions" if kind == "chat" else "/v1/completions"


def _timed(client: httpx.Client, url: str, body: dict[str, Any], key: str | None) -> float:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    started = time.perf_counter()
    reply = client.post(url, json=body, headers=headers)
    elapsed = time.perf_counter() - started
    if reply.status_code != 200:
        raise RuntimeError(f"{url} answered {reply.status_code}: {reply.text[:300]}")
    return 1000 * elapsed


def lone_pairs(
    engine_url: str,
    front_url: str,
    key: str,
    model: str,
    kind: str,
    pairs: int,
    first: int,
    advance: Callable[[], None],
) -> PairFigures:
    """`pairs` alternated pairs of one kind; request numbers start at `first`."""
    direct: list[float] = []
    front: list[float] = []
    with httpx.Client(timeout=120) as client:
        for pair in range(pairs):
            # Each side gets a prompt of its own, so that the second never finds the first's
            # prompt cached.
            number = first + 2 * pair
            sides = [
                (direct, engine_url + _path(kind), _body(kind, number, model), None),
                (
                    front,
                    front_url + _path(kind),
                    {**_body(kind, number + 1, model), "bid": _BID},
                    key,
                ),
            ]
            if pair % 2:
                sides.reverse()
            for sink, url, body, auth in sides:
                sink.append(_timed(client, url, body, auth))
            advance()
    added = [f - d for f, d in zip(front, direct, strict=True)]
    deciles = statistics.quantiles(added, n=10)
    return PairFigures(
        kind,
        pairs,
        statistics.median(direct),
        statistics.median(front),
        statistics.median(added),
        deciles[8],
    )


def closed_loop(url: str, key: str | None, model: str, clients: int, seconds: float) -> float:
    """Requests per second from `clients` threads, each sending its next request as soon as
    the last is answered."""
    return closed_loop_count(url, key, model, clients, seconds)[0]


def closed_loop_count(
    url: str, key: str | None, model: str, clients: int, seconds: float
) -> tuple[float, int]:
    """`closed_loop`'s rate, and the requests answered."""
    done = [0] * clients
    stop = threading.Event()
    failures: list[str] = []

    def client_loop(index: int) -> None:
        with httpx.Client(timeout=120) as client:
            number = index * 1_000_000
            while not stop.is_set():
                number += 1
                body = _body("text", number, model)
                if key:
                    body["bid"] = _BID
                try:
                    _timed(client, url + "/v1/completions", body, key)
                except (RuntimeError, httpx.HTTPError) as error:
                    failures.append(str(error))
                    return
                done[index] += 1

    threads = [threading.Thread(target=client_loop, args=(i,)) for i in range(clients)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    time.sleep(seconds)
    stop.set()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - started
    if failures:
        raise RuntimeError(f"{len(failures)} clients failed; the first: {failures[0]}")
    return sum(done) / elapsed, sum(done)


@contextlib.contextmanager
def engine(kind: str, folder: Path, clients: int) -> Iterator[str]:
    """The engine's base URL, for as long as the block runs."""
    with engine_process(kind, folder, clients) as (url, _):
        yield url


@contextlib.contextmanager
def engine_process(kind: str, folder: Path, clients: int) -> Iterator[tuple[str, int]]:
    """The engine's base URL and the process id at the root of its tree."""
    if kind == "sglang":
        server = SGLangServer(max_running_requests=clients, log_path=folder / "sglang.log")
        server.start()
        assert server.process is not None
        try:
            yield server.url, server.process.pid
        finally:
            server.stop()
        return
    port = free_port()
    service = start_service(
        "emulator",
        [*_CLI, "emulate-sglang", "--port", str(port), "--log-level", "warning"],
        url=f"http://127.0.0.1:{port}",
        health_path="/health",
        log_dir=folder,
    )
    try:
        yield service.url, service.process.pid
    finally:
        service.stop()


def front(engine_url: str, database_url: str, folder: Path) -> Service:
    """The auction server in front of the engine, with its defaults."""
    port = free_port()
    command = [*_CLI, "serve", "--port", str(port), "--engine-url", engine_url]
    command += ["--database-url", database_url, "--log-level", "warning"]
    return start_service(
        "auction",
        command,
        url=f"http://127.0.0.1:{port}",
        health_path="/health",
        log_dir=folder,
        env={
            "INFERENCE_AUCTION_RATE_LIMIT_PER_SECOND": "1000000",
            "INFERENCE_AUCTION_RATE_LIMIT_BURST": "1000000",
        },
        timeout=180,
    )


def _arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.lone_request",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--engine",
        choices=["sglang", "emulator"],
        default="sglang",
        help="the real SGLang on this CPU (`make sglang-env` builds it) or the emulator "
        "(default: sglang)",
    )
    parser.add_argument("--pairs", type=int, default=200, help="pairs per kind (default: 200)")
    parser.add_argument("--clients", type=int, default=32, help="closed-loop clients (default: 32)")
    parser.add_argument(
        "--seconds", type=float, default=15, help="each throughput run (default: 15)"
    )
    parser.add_argument(
        "--database", choices=["sqlite", "postgresql"], default="sqlite", help="the ledger"
    )
    add_postgres_option(parser)
    args = parser.parse_args(argv)
    if args.pairs < 10 or args.clients < 1 or args.seconds <= 0:
        parser.error("--pairs must be at least 10, --clients at least 1, --seconds above 0")
    return args


def main(argv: list[str] | None = None) -> int:
    args = _arguments(argv)
    console = Console()
    with (
        tempfile.TemporaryDirectory(prefix="bench-lone-request-") as scratch,
        Progress(console=console, transient=True) as progress,
    ):
        folder = Path(scratch)
        task = progress.add_task("starting the engine", total=2 * args.pairs + 3)
        with (
            engine_process(args.engine, folder, args.clients) as (engine_url, engine_pid),
            fresh_database(args.database, folder, args.postgres_url) as url,
        ):
            users = create_users(url, 1)
            progress.update(task, description="starting the server")
            server = front(engine_url, url, folder)
            try:
                model = httpx.get(engine_url + "/v1/models", timeout=30).json()["data"][0]["id"]
                # Warm both paths: connections, the tokenizer, the first ledger writes.
                lone_pairs(
                    engine_url, server.url, users.keys[0], model, "text", 10, 10**8, _nothing
                )
                lone_pairs(
                    engine_url, server.url, users.keys[0], model, "chat", 10, 10**8, _nothing
                )
                figures = []
                for number, kind in enumerate(("text", "chat")):
                    progress.update(task, description=f"{kind}: lone requests, alternated")
                    figures.append(
                        lone_pairs(
                            engine_url,
                            server.url,
                            users.keys[0],
                            model,
                            kind,
                            args.pairs,
                            number * 10**7,
                            lambda: progress.advance(task),
                        )
                    )
                rates = []
                cpu: list[tuple[float, float]] = []  # server, engine: ms per request
                for label, base, key in (
                    ("direct", engine_url, None),
                    ("through the server", server.url, users.keys[0]),
                    ("direct", engine_url, None),
                ):
                    progress.update(task, description=f"{args.clients} clients, {label}")
                    before = server.cpu_seconds(), tree_cpu_seconds(engine_pid)
                    rate, answered = closed_loop_count(base, key, model, args.clients, args.seconds)
                    after = server.cpu_seconds(), tree_cpu_seconds(engine_pid)
                    rates.append(rate)
                    cpu.append(
                        (
                            1000 * (after[0] - before[0]) / max(answered, 1),
                            1000 * (after[1] - before[1]) / max(answered, 1),
                        )
                    )
                    progress.advance(task)
                timings = httpx.get(
                    server.url + "/v1/admin/timings",
                    headers={"Authorization": f"Bearer {users.admin_key}"},
                    timeout=30,
                ).json()
            finally:
                server.stop()
    throughput = ThroughputFigures(
        args.clients,
        (rates[0] + rates[2]) / 2,
        rates[1],
        server_cpu_ms=cpu[1][0],
        engine_cpu_ms=cpu[1][1],
        engine_direct_cpu_ms=(cpu[0][1] + cpu[2][1]) / 2,
    )
    _print(args, figures, throughput, timings)
    return 0


def _print(
    args: argparse.Namespace,
    figures: list[PairFigures],
    throughput: ThroughputFigures,
    timings: Any,
) -> None:
    print(f"engine: {args.engine}, ledger: {args.database}")
    print()
    print(
        "| request | pairs | direct p50 ms | through the server p50 ms "
        "| added p50 ms | added p90 ms |"
    )
    print("|---|---:|---:|---:|---:|---:|")
    for row in figures:
        print(
            f"| {row.kind} | {row.pairs} | {row.direct_p50:.2f} | {row.front_p50:.2f} "
            f"| {row.added_p50:.2f} | {row.added_p90:.2f} |"
        )
    print()
    print(
        "| clients | direct req/s | through the server req/s | ratio "
        "| engine CPU ms/req, direct | engine CPU ms/req, through | server CPU ms/req |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|")
    print(
        f"| {throughput.clients} | {throughput.direct_rps:.1f} | {throughput.front_rps:.1f} "
        f"| {throughput.ratio:.3f}x | {throughput.engine_direct_cpu_ms:.1f} "
        f"| {throughput.engine_cpu_ms:.1f} | {throughput.server_cpu_ms:.1f} |"
    )
    print()
    print("The server's own timings (GET /v1/admin/timings):")
    print(timings)


if __name__ == "__main__":
    raise SystemExit(main())
