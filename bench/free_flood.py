"""Can free traffic starve paying requests' decoding? Paying latency alone and under three floods.

Starts `inference-auction emulate-sglang` (the SGLang emulator: prefill 0.1 ms a prompt token,
25 ms a decode step, a new prefill before the next decode step, as SGLang) and, in front of it,
`inference-auction serve --engine-url ...` on a temporary SQLite ledger, once per server
setting. Paying users (short prompts, 64-128 new tokens, a positive bid) send at a steady rate,
first alone, then under each flood of users with a budget of 0:

* `long prompts`: fresh ~5,000-token prompts with one new token (each one a long prefill step);
* `long answers`: short prompts with long answers;
* `many short`: many short requests with short answers.

Every rate and duration is in model seconds: the emulator runs --time-scale wall seconds per
model second, and the script sends at its rates divided by the scale. Latencies are printed
in wall seconds as measured here (their model-time equivalent is roughly wall / scale; the
server's own overhead is not scaled), and as a ratio to the paying p50 with no flood under the
same setting, measured in the same run. TTFT is the time to the first streamed text.

`--engine sglang` runs the same against the real SGLang on this CPU (`make sglang-env`; its
tiny model has 2,048 positions, so the long prompts there are 300 random words, about 1,600
tokens), in real time: the time scale is 1 and the engine's own KV tokens are the
server's `engine_tokens`, as the engine's URL states them.

Run: `python -m bench.free_flood` (about 4 minutes; see --help).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from rich.console import Console
from rich.table import Table

from bench.serving_processes import Service, free_port, start_service
from bench.sglang_cpu.launcher import SGLangServer
from inference_auctions.billing import Ledger, migrate

# The server settings compared: the default, free traffic beside paying traffic, and the
# scheduling before the rolling auction (batches of the oldest waiting, whatever they bid).
SETTINGS: dict[str, list[str]] = {
    "idle": ["--free-traffic", "idle"],
    "shared": ["--free-traffic", "shared"],
    "batches": ["--scheduling", "batches"],
}
SHAPES = ("none", "long prompts", "long answers", "many short")
PAYING_BID = "0.01"  # credits per request: any positive bid pays
# The real SGLang's model here (`make sglang-env`) has 2,048 positions, and its tokenizer's
# 512-token vocabulary makes a random five-letter word about 5.4 tokens: 300 words are about
# 1,600 tokens, the longest prompt that leaves an answer room.
_SGLANG_LONGEST_PROMPT = 300


@dataclass(frozen=True)
class Flood:
    """One flood shape: requests per model second (all users together), prompt words, answer."""

    rate: float
    prompt_words: int
    new_tokens: int


@dataclass(frozen=True)
class Plan:
    """What one run does (see `--help`)."""

    time_scale: float
    phase_seconds: float
    paying_users: int
    paying_rate: float
    free_users: int
    floods: dict[str, Flood]
    settings: list[str]
    seed: int
    engine_tokens: int | None = None
    engine: str = "emulator"  # or "sglang": the real SGLang on this CPU


@dataclass
class Latencies:
    """The paying requests' end-to-end latencies and TTFTs of one phase, wall seconds."""

    end_to_end: list[float] = field(default_factory=list)
    first_token: list[float] = field(default_factory=list)
    failed: int = 0
    free_sent: int = 0
    free_served: int = 0  # answered before the phase's end (the rest are cancelled then)


def _words(rng: random.Random, count: int) -> str:
    """`count` random five-letter words: one token each, never cached (fresh per request)."""
    letters = "abcdefghijklmnopqrstuvwxyz"
    return " ".join("".join(rng.choices(letters, k=5)) for _ in range(count))


async def _paying_request(
    client: httpx.AsyncClient, key: str, body: dict[str, object], into: Latencies
) -> None:
    """One streamed paying request; records its end-to-end latency and its TTFT."""
    started = time.monotonic()
    first: float | None = None
    try:
        async with client.stream(
            "POST", "/generate", json=body, headers={"Authorization": f"Bearer {key}"}
        ) as response:
            if response.status_code != 200:
                into.failed += 1
                return
            async for line in response.aiter_lines():
                # The first event (the clearance) has no text: the first token's does.
                if (
                    first is None
                    and line.startswith("data: {")
                    and json.loads(line[6:]).get("text")
                ):
                    first = time.monotonic()
    except httpx.HTTPError:
        into.failed += 1
        return
    ended = time.monotonic()
    into.end_to_end.append(ended - started)
    into.first_token.append((first or ended) - started)


async def _free_request(
    client: httpx.AsyncClient, key: str, body: dict[str, object], into: Latencies
) -> None:
    """One free request, counted if answered (it is cancelled at the phase's end if not)."""
    with contextlib.suppress(httpx.HTTPError):
        headers = {"Authorization": f"Bearer {key}"}
        response = await client.post("/generate", json=body, headers=headers)
        into.free_served += response.status_code == 200


async def _phase(
    url: str, plan: Plan, shape: str, payers: list[str], free: list[str], rng: random.Random
) -> Latencies:
    """Paying requests at their steady rate for one phase, beside the flood `shape`; waits for
    the paying ones, then cancels what is left of the flood (its clients leave)."""
    result = Latencies()
    scale = plan.time_scale
    wall = plan.phase_seconds * scale
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    timeout = httpx.Timeout(600, connect=10)
    async with (
        httpx.AsyncClient(base_url=url, limits=limits, timeout=timeout) as paying_client,
        httpx.AsyncClient(base_url=url, limits=limits, timeout=timeout) as free_client,
    ):
        paying: list[asyncio.Task[None]] = []
        flooding: list[asyncio.Task[None]] = []

        async def send_paying() -> None:
            gap = scale / plan.paying_rate
            for index in range(round(plan.paying_rate * plan.phase_seconds)):
                body = {
                    "text": f"Question {index}: {_words(rng, 20)}",
                    "bid": PAYING_BID,
                    "stream": True,
                    "sampling_params": {
                        "max_new_tokens": rng.randint(64, 128),
                        "ignore_eos": True,
                    },
                }
                key = payers[index % len(payers)]
                paying.append(
                    asyncio.create_task(_paying_request(paying_client, key, body, result))
                )
                await asyncio.sleep(gap)

        async def send_free(flood: Flood) -> None:
            gap = scale / flood.rate
            deadline = time.monotonic() + wall
            while time.monotonic() < deadline:
                body: dict[str, object] = {
                    "text": _words(rng, flood.prompt_words),
                    "sampling_params": {"max_new_tokens": flood.new_tokens, "ignore_eos": True},
                }
                key = free[result.free_sent % len(free)]
                flooding.append(asyncio.create_task(_free_request(free_client, key, body, result)))
                result.free_sent += 1  # counted as it goes: the sender may be cancelled
                await asyncio.sleep(gap)

        flood = plan.floods.get(shape)
        sender = asyncio.create_task(send_free(flood)) if flood else None
        await send_paying()
        await asyncio.gather(*paying)
        if sender is not None:
            sender.cancel()
        for task in flooding:
            task.cancel()
        await asyncio.gather(*flooding, return_exceptions=True)
    return result


def _queue_length(url: str) -> float:
    text = httpx.get(url + "/metrics", timeout=10).text
    line = next(x for x in text.splitlines() if x.startswith("inference_auction_queue_length "))
    return float(line.split()[1])


def _drain(url: str, scale: float, limit: float = 60) -> None:
    """Wait until the server's pool is empty, then for the engine's last requests to end."""
    deadline = time.monotonic() + limit
    while _queue_length(url) > 0 and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(max(0.5, 4 * scale))  # an aborted or last answer leaves the engine


def _users(database_url: str, plan: Plan) -> tuple[list[str], list[str]]:
    """Create the paying users (a large budget) and the free ones (a budget of 0)."""
    migrate.upgrade(database_url)
    ledger = Ledger.from_url(database_url)
    try:
        payers = [
            ledger.create_user(f"payer{i}", budget_micros=10**12).api_key
            for i in range(plan.paying_users)
        ]
        free = [
            ledger.create_user(f"free{i}", budget_micros=0).api_key for i in range(plan.free_users)
        ]
    finally:
        ledger.close()
    return payers, free


_CLI = [sys.executable, "-m", "inference_auctions.server.cli"]


def _start_engine(folder: Path, name: str, plan: Plan) -> tuple[Service | SGLangServer, str]:
    """The engine of one setting's run: the emulator, or the real SGLang on this CPU."""
    if plan.engine == "sglang":
        sglang = SGLangServer(log_path=folder / f"sglang-{name}.log")
        sglang.start()
        return sglang, sglang.url
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    emulator = start_service(
        f"emulator-{name}",
        [
            *_CLI,
            "emulate-sglang",
            *("--port", str(port), "--time-scale", str(plan.time_scale)),
            *("--log-level", "warning"),
        ],
        url=url,
        health_path="/health",
        log_dir=folder,
    )
    return emulator, url


def _start(
    folder: Path, name: str, plan: Plan, server_options: Sequence[str]
) -> tuple[Service | SGLangServer, Service, str, str]:
    """The engine and an auction server in front of it, on a fresh ledger."""
    database_url = f"sqlite:///{folder / f'{name}.db'}"
    engine, engine_url = _start_engine(folder, name, plan)
    server_port = free_port()
    server_url = f"http://127.0.0.1:{server_port}"
    env = {
        "INFERENCE_AUCTION_RUN_JOBS": "false",
        # One address sends everything here: the per-address and rate caps would measure
        # themselves, not the engine's time.
        "INFERENCE_AUCTION_CONNECTION_SHARE_PER_CLIENT": "1",
        "INFERENCE_AUCTION_RATE_LIMIT_PER_SECOND": "100000",
        "INFERENCE_AUCTION_RATE_LIMIT_BURST": "100000",
    }
    if plan.engine_tokens is not None:
        env["INFERENCE_AUCTION_ENGINE_TOKENS"] = str(plan.engine_tokens)
    try:
        server = start_service(
            f"server-{name}",
            [
                *_CLI,
                "serve",
                *("--port", str(server_port), "--engine-url", engine_url),
                *("--database-url", database_url, "--log-level", "warning", *server_options),
            ],
            url=server_url,
            health_path="/health",
            log_dir=folder,
            env=env,
        )
    except BaseException:
        engine.stop()
        raise
    return engine, server, server_url, database_url


def run(plan: Plan, folder: Path, console: Console) -> dict[str, dict[str, Latencies]]:
    """Every setting, every shape: the paying requests' latencies."""
    results: dict[str, dict[str, Latencies]] = {}
    for name in plan.settings:
        engine, server, url, database_url = _start(folder, name, plan, SETTINGS[name])
        try:
            payers, free = _users(database_url, plan)
            rng = random.Random(plan.seed)
            warm = Plan(**{**plan.__dict__, "phase_seconds": 2.0})
            asyncio.run(_phase(url, warm, "none", payers, free, rng))
            _drain(url, plan.time_scale)
            results[name] = {}
            for shape in ("none", *plan.floods):
                started = time.monotonic()
                latencies = asyncio.run(_phase(url, plan, shape, payers, free, rng))
                _drain(url, plan.time_scale)
                results[name][shape] = latencies
                console.log(
                    f"{name:8} {shape:13} paying {len(latencies.end_to_end)} "
                    f"(failed {latencies.failed}), free sent {latencies.free_sent} "
                    f"served {latencies.free_served}, "
                    f"{time.monotonic() - started:.1f} s"
                )
        finally:
            server.stop()
            engine.stop()
    return results


def _percentile(values: list[float], share: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(share * (len(ordered) - 1)))]


def table(results: dict[str, dict[str, Latencies]], plan: Plan) -> Table:
    """p50 / p90 end to end and p50 TTFT per setting and shape, and p50 over no flood's."""
    engine = (
        "the real SGLang on this CPU"
        if plan.engine == "sglang"
        else f"emulator, time scale {plan.time_scale}"
    )
    out = Table(
        title=f"Paying requests under free floods ({engine}, wall seconds; ratio: p50 over "
        "the same setting's p50 with no flood)"
    )
    for column in ("setting", "flood", "paying", "p50 e2e", "p90 e2e", "p50 TTFT", "p90 TTFT"):
        out.add_column(column, justify="left" if column in ("setting", "flood") else "right")
    out.add_column("p50 / no flood", justify="right")
    out.add_column("free served / sent", justify="right")
    for name, shapes in results.items():
        alone = statistics.median(shapes["none"].end_to_end)
        for shape, latencies in shapes.items():
            p50 = statistics.median(latencies.end_to_end)
            ratio = p50 / alone
            mark = "" if shape == "none" else (" ok" if ratio <= 1.5 else " OVER")
            out.add_row(
                name,
                shape,
                f"{len(latencies.end_to_end)}"
                + (f" ({latencies.failed} failed)" if latencies.failed else ""),
                f"{p50:.2f}",
                f"{_percentile(latencies.end_to_end, 0.9):.2f}",
                f"{statistics.median(latencies.first_token):.2f}",
                f"{_percentile(latencies.first_token, 0.9):.2f}",
                f"{ratio:.2f}x{mark}",
                f"{latencies.free_served} / {latencies.free_sent}" if shape != "none" else "",
            )
    return out


def _arguments(argv: Sequence[str] | None = None) -> Plan:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add = parser.add_argument
    add(
        "--engine",
        choices=["emulator", "sglang"],
        default="emulator",
        help="the emulator, or the real SGLang on this CPU (`make sglang-env` builds it; real "
        "time, so --time-scale is 1 there)",
    )
    add("--time-scale", type=float, default=0.2, help="emulator wall seconds per model second")
    add("--phase-seconds", type=float, default=60.0, help="model seconds of paying traffic a phase")
    add("--paying-users", type=int, default=4)
    add("--paying-rate", type=float, default=1.0, help="paying requests per model second, in all")
    add("--free-users", type=int, default=60, help="users with a budget of 0 sending the floods")
    add("--long-prompt-rate", type=float, default=2.0, help="long prompts per model second")
    add(
        "--long-prompt-words",
        type=int,
        help="words of a long prompt (default: 5,000 on the emulator, a token each there; "
        f"{_SGLANG_LONGEST_PROMPT} on the real SGLang, about 5.4 tokens each there)",
    )
    add("--long-answer-rate", type=float, default=4.0, help="long answers per model second")
    add("--long-answer-tokens", type=int, default=512, help="new tokens of a long answer")
    add("--short-rate", type=float, default=10.0, help="short free requests per model second")
    add("--settings", nargs="+", choices=list(SETTINGS), default=list(SETTINGS))
    add("--shapes", nargs="+", choices=SHAPES[1:], default=list(SHAPES[1:]))
    add("--seed", type=int, default=48)
    add(
        "--engine-tokens",
        type=int,
        help="the server's engine_tokens (the engine's KV tokens, for the shares; default: "
        "unset, as for any engine URL: the free share counts slots only)",
    )
    args = parser.parse_args(argv)
    if args.long_prompt_words is None:
        args.long_prompt_words = _SGLANG_LONGEST_PROMPT if args.engine == "sglang" else 5_000
    if args.engine == "sglang":
        args.time_scale = 1.0
        if args.long_prompt_words > _SGLANG_LONGEST_PROMPT:
            parser.error(
                f"--long-prompt-words {args.long_prompt_words}: the real SGLang's model here has "
                f"2,048 positions; give {_SGLANG_LONGEST_PROMPT} words or fewer"
            )
    floods = {
        "long prompts": Flood(args.long_prompt_rate, args.long_prompt_words, 1),
        "long answers": Flood(args.long_answer_rate, 20, args.long_answer_tokens),
        "many short": Flood(args.short_rate, 20, 8),
    }
    return Plan(
        time_scale=args.time_scale,
        phase_seconds=args.phase_seconds,
        paying_users=args.paying_users,
        paying_rate=args.paying_rate,
        free_users=args.free_users,
        floods={shape: floods[shape] for shape in args.shapes},
        settings=args.settings,
        seed=args.seed,
        engine_tokens=args.engine_tokens,
        engine=args.engine,
    )


def main() -> None:
    """Run every setting and shape, print the table."""
    plan = _arguments()
    console = Console(width=120)
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as folder:
        results = run(plan, Path(folder), console)
    console.print(table(results, plan))
    console.print(
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
        f"{time.monotonic() - started:.0f} s in all"
    )


if __name__ == "__main__":
    main()
