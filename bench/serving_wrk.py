"""One `wrk` run with a script of bench/wrk, read back from the line its Lua `done()` prints;
and the command-line options of the benchmarks that drive it."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

SCRIPTS = Path(__file__).parent / "wrk"
THREADS = 2
_MARK = "BENCH_JSON "


@dataclass(frozen=True)
class WrkResult:
    """What one run measured; latencies in milliseconds."""

    requests: int
    seconds: float
    statuses: dict[int, int]
    socket_errors: int
    p50_ms: float
    p90_ms: float
    p99_ms: float

    @property
    def ok(self) -> int:
        """Responses with a 2xx status."""
        return sum(count for status, count in self.statuses.items() if 200 <= status < 300)

    @property
    def not_ok(self) -> int:
        """Responses with another status, plus connections that failed or timed out."""
        return self.requests - self.ok + self.socket_errors

    @property
    def rate(self) -> float:
        """Completed requests per second."""
        return self.requests / self.seconds if self.seconds else 0.0


def run_wrk(
    script: str,
    url: str,
    connections: int,
    seconds: float,
    args: Sequence[str] = (),
    output_tokens: int = 4,
) -> WrkResult:
    """`wrk -t2 -c<connections> -d<seconds>` with `script` (run from bench/wrk, where the
    scripts find report.lua); `args` reach the script's `init`, `output_tokens` its bodies
    (`BENCH_OUTPUT_TOKENS`)."""
    if shutil.which("wrk") is None:
        raise SystemExit("wrk, the load generator, is not installed (Debian: apt-get install wrk)")
    threads = min(THREADS, connections)
    command = ["wrk", f"-t{threads}", f"-c{connections}", f"-d{seconds:g}s", "--timeout", "30s"]
    command += ["-s", script, url]
    if args:
        command += ["--", *args]
    done = subprocess.run(
        command,
        cwd=SCRIPTS,
        env={**os.environ, "BENCH_OUTPUT_TOKENS": str(output_tokens)},
        capture_output=True,
        text=True,
        check=False,
        timeout=seconds + 120,
    )
    line = next((ln for ln in done.stdout.splitlines() if ln.startswith(_MARK)), None)
    if done.returncode != 0 or line is None:
        raise RuntimeError(f"wrk failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    data = json.loads(line[len(_MARK) :])
    errors = data["errors"]
    latency = data["latency_us"]
    return WrkResult(
        requests=int(data["requests"]),
        seconds=data["duration_us"] / 1e6,
        statuses={int(status): int(count) for status, count in data["statuses"].items()},
        socket_errors=int(errors["connect"] + errors["read"] + errors["write"] + errors["timeout"]),
        p50_ms=latency["p50"] / 1e3,
        p90_ms=latency["p90"] / 1e3,
        p99_ms=latency["p99"] / 1e3,
    )


def add_load_options(parser: argparse.ArgumentParser, *, seconds: float) -> None:
    """`--connections`, `--seconds` (default `seconds`) and `--warmup`: the wrk runs of a
    serving benchmark."""
    parser.add_argument(
        "--connections",
        type=int,
        nargs="+",
        default=[20, 200],
        help="wrk connection counts (default: 20 200)",
    )
    parser.add_argument(
        "--seconds",
        type=float,
        default=seconds,
        help=f"length of each measured run (default: {seconds:g})",
    )
    parser.add_argument(
        "--warmup", type=float, default=2.0, help="length of the warm-up before each (default: 2)"
    )
