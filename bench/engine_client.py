"""What one streamed generation costs the auction server's CPU in its HTTP client to SGLang.

Starts the SGLang emulator as its own process (`inference-auction emulate-sglang --time-scale
0.001`), then sends N streamed `/generate` requests of 4 output tokens (4-5 server-sent events
each) at concurrency 1 and 50 through each client path, and prints, per path and concurrency,
the client process's CPU time per request (`time.process_time`, user + system, divided by N)
and the requests per second:

* httpx: the engine's former path (httpx's AsyncClient, a trace hook for the body's sending,
  `aiter_lines`, `json.loads` per event);
* client: `server.engine.http_client` alone (`stream`, `events()`, `orjson.loads` per event);
* engine: the whole `SGLangHTTPEngine` (the ordered sender, `Generation`, the chunk checks).

The emulator's CPU is not counted: it runs in its own process.

Run: `python -m bench.engine_client` (see --help).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from itertools import count
from pathlib import Path
from typing import Any

import httpx
import orjson
import uvloop
from rich.console import Console
from rich.table import Table

from inference_auctions.server.engine.http_client import HTTPClient
from inference_auctions.server.engine.protocol import EngineRequest
from inference_auctions.server.engine.sglang_http import SGLangHTTPEngine

PROMPT = list(range(1000, 1032))
MAX_NEW_TOKENS = 4


@dataclass
class Row:
    """One path at one concurrency."""

    path: str
    concurrency: int
    requests: int
    cpu_us: float
    per_second: float


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _start_emulator(port: int, time_scale: float) -> subprocess.Popen[bytes]:
    found = shutil.which("inference-auction", path=str(Path(sys.executable).parent))
    command = [found] if found else [sys.executable, "-m", "inference_auctions.server.cli"]
    command += ["emulate-sglang", "--port", str(port), "--time-scale", str(time_scale)]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return process
        except httpx.TransportError:
            pass
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            raise RuntimeError("the emulator did not start")
        time.sleep(0.05)


def _body(rid: str) -> dict[str, Any]:
    return {
        "input_ids": PROMPT,
        "sampling_params": {"max_new_tokens": MAX_NEW_TOKENS},
        "rid": rid,
        "stream": True,
        "priority": 0,
    }


Send = Callable[[str], Awaitable[int]]


def _httpx_sender(client: httpx.AsyncClient) -> Send:
    """The engine's former path, as it was."""

    async def send(rid: str) -> int:
        async def on_event(event: str, _: dict[str, Any]) -> None:
            if event.endswith("send_request_body.complete"):
                pass  # the sender admitted the next request here

        options: dict[str, Any] = {
            "timeout": httpx.Timeout(None, connect=5.0),
            "extensions": {"trace": on_event},
        }
        tokens = 0
        async with client.stream("POST", "/generate", json=_body(rid), **options) as response:
            async for line in response.aiter_lines():
                if not line.startswith("data:"):
                    continue
                payload = line[len("data:") :].strip()
                if payload == "[DONE]":
                    break
                tokens = json.loads(payload)["meta_info"]["completion_tokens"]
        return int(tokens)

    return send


def _client_sender(client: HTTPClient) -> Send:
    async def send(rid: str) -> int:
        tokens = 0
        async with client.stream(
            "POST", "/generate", _body(rid), timeout=600.0, on_sent=lambda: None
        ) as response:
            async for payload in response.events():
                if payload != b"[DONE]":
                    tokens = orjson.loads(payload)["meta_info"]["completion_tokens"]
        return int(tokens)

    return send


def _engine_sender(engine: SGLangHTTPEngine) -> Send:
    async def send(rid: str) -> int:
        request = EngineRequest(rid, PROMPT, {"max_new_tokens": MAX_NEW_TOKENS}, stream=True)
        result = await engine.generate(request)
        return result.usage.completion_tokens

    return send


async def _drive(send: Send, requests: int, concurrency: int, rids: count[int]) -> float:
    """Send `requests` with `concurrency` workers; the wall time taken."""
    left = requests

    async def worker() -> None:
        nonlocal left
        while left > 0:
            left -= 1
            tokens = await send(f"b{next(rids)}")
            if tokens != MAX_NEW_TOKENS:
                raise RuntimeError(f"{tokens} tokens instead of {MAX_NEW_TOKENS}")

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return time.perf_counter() - start


async def _measure(path: str, url: str, requests: int, levels: list[int]) -> list[Row]:
    rids = count()
    rows = []
    close: Callable[[], Awaitable[None]]
    if path == "httpx":
        hx = httpx.AsyncClient(
            base_url=url, limits=httpx.Limits(max_connections=None, max_keepalive_connections=256)
        )
        send, close = _httpx_sender(hx), hx.aclose
    elif path == "client":
        client = HTTPClient(url)
        send, close = _client_sender(client), client.aclose
    else:
        engine = SGLangHTTPEngine(url)
        await engine.start()
        send, close = _engine_sender(engine), engine.close
    try:
        for concurrency in levels:
            await _drive(send, max(100, concurrency * 4), concurrency, rids)  # warm the pool
            cpu = time.process_time()
            wall = await _drive(send, requests, concurrency, rids)
            cpu = time.process_time() - cpu
            rows.append(Row(path, concurrency, requests, cpu / requests * 1e6, requests / wall))
    finally:
        await close()
    return rows


def main(argv: list[str] | None = None) -> None:
    """Run the measurement and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000, help="requests per measurement")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 50])
    parser.add_argument("--paths", nargs="+", default=["httpx", "client", "engine"])
    parser.add_argument("--time-scale", type=float, default=0.001)
    parser.add_argument(
        "--loop", choices=["uvloop", "asyncio"], default="uvloop", help="as uvicorn picks"
    )
    args = parser.parse_args(argv)
    runner: Callable[[Coroutine[Any, Any, list[Row]]], list[Row]] = asyncio.run
    if args.loop == "uvloop":
        runner = uvloop.run

    port = _free_port()
    emulator = _start_emulator(port, args.time_scale)
    url = f"http://127.0.0.1:{port}"
    rows: list[Row] = []
    try:
        for path in args.paths:
            rows += runner(_measure(path, url, args.requests, args.concurrency))
    finally:
        emulator.terminate()
        emulator.wait(30)

    table = Table(title=f"Streamed /generate, {MAX_NEW_TOKENS} tokens, {args.loop} loop")
    for name in ("path", "concurrency", "requests", "client CPU µs/request", "requests/s"):
        table.add_column(name, justify="left" if name == "path" else "right")
    for row in rows:
        table.add_row(
            row.path,
            str(row.concurrency),
            f"{row.requests:,}",
            f"{row.cpu_us:,.0f}",
            f"{row.per_second:,.0f}",
        )
    Console().print(table)


if __name__ == "__main__":
    main()
